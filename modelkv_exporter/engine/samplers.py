"""Measured memory of an engine process: CUDA allocator, device, NVML per process, or host RSS.

Every figure that cannot be read is left out of the sample (never 0). The CUDA and NVML
interfaces are parameters so the same code runs against the real ``torch.cuda`` and
``pynvml`` on a GPU and against stand-ins in CPU-only tests. Importing this module needs
only the standard library; torch is imported when a CUDA device asks for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from modelkv_exporter.contract.snapshot import MemorySample
from modelkv_exporter.engine.log import get_logger

logger = get_logger("samplers")

Sampler = Callable[[], MemorySample]
"""Takes one sample of the engine process's memory."""


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

    Inside a container without the host PID namespace NVML reports host PIDs,
    so the engine's own PID is often absent: that is "not measured", not 0.
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


def cuda_sampler(cuda: Any, device: Any, nvml: Any | None, nvml_device: str | int | None) -> Sampler:
    """A sampler of the torch CUDA allocator, the whole device and (when available) NVML."""
    pid = os.getpid()

    def sample() -> MemorySample:
        values: dict[str, int] = {}
        readings: tuple[tuple[str, Callable[[], int]], ...] = (
            ("torch_allocated", lambda: cuda.memory_allocated(device)),
            ("torch_reserved", lambda: cuda.memory_reserved(device)),
            ("torch_peak_allocated", lambda: cuda.max_memory_allocated(device)),
        )
        for source, read in readings:
            try:
                values[source] = int(read())
            except Exception:
                pass
        try:
            free, total = cuda.mem_get_info(device)
            values["device_used"] = int(total) - int(free)
            values["device_total"] = int(total)
        except Exception:
            pass
        if nvml is not None and nvml_device is not None:
            used = nvml_process_bytes(nvml, nvml_device, pid)
            if used is not None:
                values["process_gpu"] = used
        rss = process_resident_bytes()
        if rss is not None:
            values["process_resident"] = rss
        return MemorySample(sampled_at=time.time(), values=values)

    return sample


def sampler_for(device: Any) -> Sampler:
    """The right sampler for a worker's ``torch.device``."""
    if getattr(device, "type", None) == "cuda":
        import torch

        nvml = load_nvml()
        return cuda_sampler(torch.cuda, device, nvml, physical_device_id(device) if nvml else None)
    return sample_host_memory  # a CPU engine keeps weights and KV in host memory: RSS is its device figure


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
