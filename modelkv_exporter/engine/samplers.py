"""Measured memory of an engine process: CUDA allocator, device, NVML per process, or host RSS.

Every figure that cannot be read is left out of the sample (never 0). The CUDA and NVML
interfaces are parameters so the same code runs against the real ``torch.cuda`` and
``pynvml`` on a GPU and against stand-ins in CPU-only tests. Importing this module needs
only the standard library; torch is imported when a CUDA device asks for it.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modelkv_exporter.contract.snapshot import MemorySample, TorchSegment
from modelkv_exporter.engine.engine_log import get_logger

logger = get_logger("samplers")

Sampler = Callable[[], MemorySample]
"""Takes one sample of the engine process's memory (a ``MemorySampler`` or any function)."""


def process_resident_bytes(pid: int | str = "self") -> int | None:
    """Resident set size of a process from ``/proc``, or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            resident_pages = int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def sample_host_memory() -> MemorySample:
    """A sample holding what the host can tell of this process: its resident memory."""
    rss = process_resident_bytes()
    values = {} if rss is None else {"process_resident": rss}
    return MemorySample(sampled_at=time.time(), values=values)


def load_nvml() -> Any | None:
    """``pynvml`` initialised, or None where it is not installed or finds no driver."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception as error:
        logger.info("modelkv: NVML unavailable (%s); per-process GPU memory will not be reported", error)
        return None
    return pynvml


def nvml_process_bytes(nvml: Any, device_id: str | int, pid: int) -> int | None:
    """GPU bytes NVML attributes to ``pid`` on the device (index or UUID), or None when not found.

    The driver maps the PIDs it reports into the caller's PID namespace (driver 580 on an H200
    found the process's own PID inside a new PID namespace); a PID it cannot map, a process with
    no CUDA context yet, or usage NVML does not report is "not measured", never 0.
    """
    try:
        if isinstance(device_id, str):
            handle = nvml.nvmlDeviceGetHandleByUUID(device_id)
        else:
            handle = nvml.nvmlDeviceGetHandleByIndex(device_id)
        processes = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except Exception:
        return None
    for process in processes:
        used = getattr(process, "usedGpuMemory", None)
        if getattr(process, "pid", None) == pid and isinstance(used, int) and used >= 0:
            return used
    return None


@dataclass(frozen=True)
class PrivatePools:
    """What torch's caching allocator holds in private pools at one moment: their segments' bytes, and how many of
    those its tensors hold (the rest are free blocks, kept for the pools' own allocations: a CUDA graph's replays)."""

    total: int
    allocated: int

    @property
    def free(self) -> int:
        """Bytes of the pools' free blocks."""
        return self.total - self.allocated


LARGEST_SEGMENTS = 8
"""How many of torch's segments an engine's ending write names (``EndState.largest_segments``), largest first."""

HIGH_WATER_SECONDS = 120.0
"""How far back ``torch_allocated_high_water`` reaches: two scrapes at the common one-minute interval."""


class MemorySampler:
    """Takes samples of the engine process's memory; ``initialised`` marks the end of the engine's initialisation.

    The base class samples what the host can tell (resident memory); ``CudaSampler`` adds CUDA and NVML.
    """

    def __call__(self) -> MemorySample:
        """One sample now."""
        return sample_host_memory()

    def initialised(self, profiled_activation_peak: int | None = None) -> MemorySample:
        """The engine finished initialising: return the baseline sample (the activation peak is for CUDA samplers)."""
        return self()

    def private_pools(self) -> PrivatePools | None:
        """What torch's caching allocator holds in private pools (CUDA graph pools); None where it keeps none."""
        return None

    def largest_segments(self) -> tuple[TorchSegment, ...] | None:
        """Torch's largest segments on the device now, largest first; None where torch keeps none (a CPU engine)."""
        return None


class CudaSampler(MemorySampler):
    """Samples the torch CUDA allocator, the whole device, NVML (when available) and host memory.

    ``torch_allocated_high_water`` is the highest live-tensor figure of the samples of the last
    ``HIGH_WATER_SECONDS``, each sample reporting torch's peak since the one before, so that an
    allocation that lives between two samples is still seen. Torch keeps a single peak per device,
    which vLLM resets and reads while it loads and profiles: this sampler only reads it until
    ``initialised`` is called, and from then on resets it after each reading, except while a
    caller that measures the peak itself holds the resets (``hold_resets``).

    ``torch_allocated_low_water`` is the lowest live-tensor figure of the samples of the same window:
    the live tensors between engine steps, read at the samples (docs/engine-hook.md says why at the
    samples and not at each step). It restarts at the baseline, so it never reaches back into loading.
    """

    def __init__(
        self,
        cuda: Any,
        device: Any,
        nvml: Any | None = None,
        nvml_device: str | int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cuda = cuda
        self.device = device
        self.nvml = nvml
        self.nvml_device = nvml_device
        self.clock = clock
        self.pid = os.getpid()
        self.resetting = False
        self._holds = 0
        self._lock = threading.Lock()
        self._peaks: collections.deque[tuple[float, int]] = collections.deque()
        self._floors: collections.deque[tuple[float, int]] = collections.deque()
        self._peak_since_start = 0

    def __call__(self) -> MemorySample:
        with self._lock:
            return self._sample()

    def initialised(self, profiled_activation_peak: int | None = None) -> MemorySample:
        """The baseline sample, and the start of peak resets.

        The baseline's high-water mark is the highest of the peak seen while initialising and the
        live tensors now plus ``profiled_activation_peak`` (the activation peak the engine profiled and
        planned for): what the engine's memory plan allows live tensors to reach.
        """
        with self._lock:
            sample = self._sample()
            self.resetting = True
            self._reset_peak()
            self._peaks.clear()
            self._floors.clear()
            values = dict(sample.values)
            allocated = values.get("torch_allocated")
            if allocated is not None:
                values["torch_allocated_low_water"] = _lowest_within(self._floors, self.clock(), allocated)
            if allocated is not None and profiled_activation_peak:
                high = max(values.get("torch_allocated_high_water", 0), allocated + profiled_activation_peak)
                values["torch_allocated_high_water"] = high
            return MemorySample(sample.sampled_at, values)

    def private_pools(self) -> PrivatePools | None:
        """The segments torch's caching allocator holds on this device in private pools (CUDA graph pools, vLLM's
        sleep-mode pool): their bytes and the bytes allocated in them, from its own books (``memory_snapshot``);
        None when torch cannot say.

        Not for an engine step: it lists every segment. The capture wrapper reads it before and after a capture.
        """
        segments = self._segments()
        if segments is None:
            return None
        total = allocated = 0
        try:
            for segment in segments:
                if tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0):
                    total += int(segment["total_size"])
                    allocated += int(segment["allocated_size"])
        except Exception:
            return None
        return PrivatePools(total, allocated)

    def largest_segments(self) -> tuple[TorchSegment, ...] | None:
        """The ``LARGEST_SEGMENTS`` largest segments torch's caching allocator holds on this device, from its own books
        (``memory_snapshot``), largest first: their sizes and the bytes live tensors use of them; None when torch
        cannot say. For an engine's ending write only: it lists every segment."""
        segments = self._segments()
        if segments is None:
            return None
        try:
            found = sorted(
                ((int(segment["total_size"]), int(segment["allocated_size"])) for segment in segments), reverse=True
            )
        except Exception:
            return None
        return tuple(TorchSegment(total, allocated) for total, allocated in found[:LARGEST_SEGMENTS])

    def _segments(self) -> list[Any] | None:
        """The segments torch's caching allocator holds on this device (``memory_snapshot``); None when torch cannot
        say."""
        index = getattr(self.device, "index", None)
        index = index if isinstance(index, int) else None
        try:
            try:
                segments = self.cuda.memory_snapshot(include_traces=False)
            except TypeError:  # a torch before 2.10 records no traces unless asked to
                segments = self.cuda.memory_snapshot()
            return [segment for segment in segments if index is None or segment.get("device", index) == index]
        except Exception:
            return None

    def hold_resets(self) -> Callable[[], None]:
        """Stop resetting torch's peak until the returned function is called (once per hold).

        For a caller about to measure the peak itself (vLLM re-running its memory profile): a
        sample then still reads the peak, so the next one covers a longer window, never a shorter one.
        """
        with self._lock:
            self._holds += 1
        held = True

        def release() -> None:
            nonlocal held
            with self._lock:
                if held:
                    held = False
                    self._holds -= 1

        return release

    def _reset_peak(self) -> None:
        if self._holds:
            return
        try:
            self.cuda.reset_peak_memory_stats(self.device)
        except Exception:
            pass

    def _read(self, read: Callable[[], Any]) -> int | None:
        try:
            return int(read())
        except Exception:
            return None

    def _sample(self) -> MemorySample:
        cuda, device = self.cuda, self.device
        readings = {
            "torch_allocated": self._read(lambda: cuda.memory_allocated(device)),
            "torch_reserved": self._read(lambda: cuda.memory_reserved(device)),
        }
        values = {source: value for source, value in readings.items() if value is not None}
        allocated = values.get("torch_allocated")
        if allocated is not None:
            values["torch_allocated_low_water"] = _lowest_within(self._floors, self.clock(), allocated)
        peak = self._read(lambda: cuda.max_memory_allocated(device))
        if peak is not None:
            if self.resetting:
                self._reset_peak()
            now = self.clock()
            self._peaks.append((now, peak))
            _forget_before(self._peaks, now - HIGH_WATER_SECONDS)
            high = max(p for _, p in self._peaks)
            values["torch_allocated_high_water"] = max(high, values.get("torch_allocated", 0))
            self._peak_since_start = max(self._peak_since_start, peak)
            values["torch_peak_allocated"] = self._peak_since_start
        try:
            free, total = cuda.mem_get_info(device)
            values["device_used"] = int(total) - int(free)
            values["device_total"] = int(total)
        except Exception:
            pass
        if self.nvml is not None and self.nvml_device is not None:
            used = nvml_process_bytes(self.nvml, self.nvml_device, self.pid)
            if used is not None:
                values["process_gpu"] = used
        rss = process_resident_bytes()
        if rss is not None:
            values["process_resident"] = rss
        return MemorySample(sampled_at=time.time(), values=values)


def _forget_before(readings: collections.deque[tuple[float, int]], since: float) -> None:
    while readings and readings[0][0] < since:
        readings.popleft()


def _lowest_within(readings: collections.deque[tuple[float, int]], now: float, reading: int) -> int:
    """Add ``reading`` taken ``now`` and return the lowest of the last ``HIGH_WATER_SECONDS`` of readings."""
    readings.append((now, reading))
    _forget_before(readings, now - HIGH_WATER_SECONDS)
    return min(r for _, r in readings)


def sampler_for(device: Any) -> MemorySampler:
    """The right sampler for a worker's ``torch.device``."""
    if getattr(device, "type", None) == "cuda":
        import torch

        nvml = load_nvml()
        return CudaSampler(torch.cuda, device, nvml, physical_device_id(device) if nvml else None)
    return MemorySampler()  # a CPU engine keeps weights and KV in host memory: RSS is its device figure


def physical_device_id(device: Any) -> str | int | None:
    """The device's UUID (``GPU-...``) when torch can tell, else its physical index, else None.

    ``local_rank`` is relative to ``CUDA_VISIBLE_DEVICES``; the UUID names the card itself.
    """
    try:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        if uuid is not None:
            text = str(uuid)
            return text if text.startswith("GPU-") else f"GPU-{text}"
    except Exception:
        pass
    index = getattr(device, "index", None)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index is None:
        return None
    if not visible:
        return int(index)
    if index < len(visible):
        entry = visible[index]
        return int(entry) if entry.isdigit() else entry
    return None
