"""Measured GPU memory against declared bytes, end to end: the real samplers, publisher, sidecar and scrape.

For each case, the demo's cache owners (real ``transformers`` caches: a sliding-window
DynamicCache, StaticCaches, an EncoderDecoderCache; several geometries and dtypes) are built
on the device, published through the engine side's real ``build_snapshot`` and
``SnapshotPublisher`` with the real sampler for that device (``torch.cuda`` and NVML on a GPU,
the process's resident memory on a CPU), then the caches are filled and sampled again. The
spool is served by the real sidecar app (FastAPI under uvicorn, in a thread on 127.0.0.1),
``/metrics`` is scraped and parsed, and a table per engine is printed: declared peak,
torch allocated and reserved growth since the baseline, NVML's figure for the process (or
"absent" and why), device used/total, and the bytes the engine side's observer saw the
owner's caches hold (``engine/observe``).

Checks (the exit status is 1 when one fails):
- on CUDA, the growth of ``torch_allocated`` after the caches are filled equals the caches'
  real storage bytes within the allocator's rounding (512 bytes a tensor), and the declared
  peak equals those bytes;
- the observed peak equals the caches' real storage bytes (or observation is reported
  unavailable, with no byte figure);
- nothing that was not measured is exported as 0: a source whose
  ``modelkv_memory_measurement_available`` is 0 has no byte series, and every figure that is
  exported is positive;
- without CUDA, the CUDA and NVML sources are reported absent;
- NVML is asked for a PID no process can have for one engine: that engine's figure is absent and
  said to be unavailable, never 0; ``--expect-nvml present``: every other engine exports NVML's
  figure for its process, at least its torch reserved bytes (``bench/gpu_run.sh`` checks this in
  a new PID namespace too, where the process's PID is not its host PID); ``--expect-nvml
  absent``: none does.

Two more sections on CUDA:
- torch's peak after the sampler's resets: a vLLM-style profile (reset torch's peak, allocate
  and free an activation, read ``allocated_bytes.all.peak``) run between two samples of a sampler
  that resets the peak must still read the whole activation, and the sampler's next high-water
  mark must hold it; with a sample *inside* it, the profile reads the whole activation while the
  sampler's resets are held (as the hook holds them around ``determine_available_memory``), and
  what a reset there would cost is printed beside it;
- NVML: the device's MIG mode, NVML's process list, and whether this PID is in it.

Any machine:   .venv/bin/python bench/gpu_truth.py
GPU machine without FastAPI/uvicorn (the device tool's README): carry the missing wheels,
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \\
      fastapi starlette uvicorn httptools pydantic pydantic-core annotated-types typing-inspection
then on the machine: pip install --no-index --no-deps --target /tmp/site .whl/*.whl; PYTHONPATH=/tmp/site:. python3 bench/gpu_truth.py
(``requirements/sidecar.txt`` names the versions; ``bench/gpu_run.sh`` is the whole device run.)
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from prometheus_client.parser import text_string_to_metric_families
from torch import nn
from transformers import EncoderDecoderCache

from modelkv_exporter.contract.vocabulary import MEASUREMENTS
from modelkv_exporter.demo import owners
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.observe import install
from modelkv_exporter.engine.protocol import declaring_owners
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_exporter.engine.samplers import (
    CudaSampler,
    load_nvml,
    nvml_process_bytes,
    physical_device_id,
    sampler_for,
)
from modelkv_exporter.sidecar.http.server import build_server
from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig

ROOT = Path(__file__).resolve().parent.parent
ALLOCATOR_GRANULE = 512
"""The CUDA caching allocator rounds every allocation up to a multiple of 512 bytes."""

SMALL_BLOCK = 2**20
"""The caching allocator's small-block limit: it hands out a large block whole when what would
remain after splitting it is this or less, and ``memory_allocated`` counts the whole block."""

ACTIVATION_BYTES = 256 * 2**20
"""The activation a profile-like measurement allocates and frees (a multiple of the granule)."""

PEAK_KEY = "allocated_bytes.all.peak"
"""The statistic vLLM's ``MemorySnapshot`` reads for torch's peak (``torch.cuda.max_memory_allocated`` reads it too)."""


@dataclass(frozen=True)
class Case:
    """One engine: a demo owner class, the dtype it runs in, its max_num_seqs, and whose PID NVML is asked for.

    ``own_pid`` False asks NVML for a PID no process can have (``/proc/sys/kernel/pid_max``):
    what the sampler meets where the driver cannot map the engine's PID into its PID namespace.
    """

    engine_id: str
    owner: str
    dtype: torch.dtype | None
    max_num_seqs: int
    own_pid: bool = True


CASES = (
    Case("codec-fp32", "CodecDecoder", None, 4),
    Case("local-bf16", "LocalTransformer", None, 8),
    Case("local-fp32", "LocalTransformer", torch.float32, 2),
    Case("whisper-bf16", "WhisperStreamingEncoder", None, 1),
    Case("talker-bf16", "TalkerGenerator", None, 1),
    Case("talker-fp16", "TalkerGenerator", torch.float16, 1),
    Case("talker-pid-unlisted", "TalkerGenerator", None, 1, own_pid=False),
)


def layer_storages(owner: owners.DemoOwner, kv: bool) -> dict[int, int]:
    """The distinct storages (by address, with their bytes) the owner's cache layers hold.

    ``kv`` True: their keys and values, what a declaration accounts for and the observer weighs.
    ``kv`` False: every other tensor a layer keeps (``transformers`` layers keep one-element
    counters such as ``cumulative_length`` on the cache's device).
    """
    storages: dict[int, int] = {}
    for caches in owner.caches.values():
        for cache in caches:
            parts = (
                [cache.self_attention_cache, cache.cross_attention_cache]
                if isinstance(cache, EncoderDecoderCache)
                else [cache]
            )
            for part in parts:
                for layer in part.layers:
                    for name, tensor in vars(layer).items():
                        if isinstance(tensor, torch.Tensor) and tensor.numel() and (name in ("keys", "values")) == kv:
                            storage = tensor.untyped_storage()
                            storages[storage.data_ptr()] = storage.nbytes()
    return storages


def storage_bytes(owner: owners.DemoOwner) -> tuple[int, list[int]]:
    """The distinct storage bytes of the owner's caches' keys and values, and the size of each storage."""
    storages = layer_storages(owner, kv=True)
    return sum(storages.values()), list(storages.values())


def allocator_slack(sizes: list[int]) -> int:
    """The most ``memory_allocated`` may count beyond these storages' bytes.

    Each block is rounded up to the 512-byte granule; a storage above the small-block limit can
    also get its block's unsplit remainder (at most ``SMALL_BLOCK``), depending on which cached
    segment it is carved from, so the figure depends on what the allocator cached before.
    """
    return sum(ALLOCATOR_GRANULE if size <= SMALL_BLOCK else ALLOCATOR_GRANULE + SMALL_BLOCK for size in sizes)


def requested_bytes(device: torch.device) -> int | None:
    """The bytes the process's live tensors asked the CUDA allocator for, before its rounding."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.memory_stats(device).get("requested_bytes.all.current", 0))


def nvml_absence(device: torch.device) -> str | None:
    """Why NVML gives no figure for this process, or None when it does."""
    if device.type != "cuda":
        return "no CUDA device"
    nvml = load_nvml()
    if nvml is None:
        return "NVML unavailable (nvidia-ml-py missing or no driver)"
    device_id = physical_device_id(device)
    if device_id is None:
        return "the device's NVML id is unknown"
    if nvml_process_bytes(nvml, device_id, os.getpid()) is None:
        return "this PID is not in NVML's process list (no CUDA context yet, or a PID the driver cannot map)"
    return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_peak(cuda: Any, device: torch.device, during: Any = None) -> int:
    """What a vLLM-style profile measures of one step: the rise of torch's peak over the step.

    As vLLM's ``memory_profiling`` does: reset the peak, read it, run the step (an activation of
    ``ACTIVATION_BYTES`` allocated and freed), read it again. ``during`` runs after the step and
    before the second reading: a sample taken there is a sample inside the profile.
    """
    cuda.reset_peak_memory_stats(device)
    before = int(cuda.memory_stats(device)[PEAK_KEY])
    activation = torch.empty(ACTIVATION_BYTES, dtype=torch.uint8, device=device)
    synchronize(device)
    del activation
    if during is not None:
        during()
    return int(cuda.memory_stats(device)[PEAK_KEY]) - before


def check_peak_after_resets(device: torch.device, problems: list[str]) -> None:
    """A profile between two samples of a resetting sampler reads the whole activation; the sampler sees it too."""
    cuda = torch.cuda
    sampler = CudaSampler(cuda, device)
    sampler.initialised()
    first = sampler()
    between = profile_peak(cuda, device)
    second = sampler()
    inside = profile_peak(cuda, device, during=sampler)
    release = sampler.hold_resets()
    held = profile_peak(cuda, device, during=sampler)
    release()
    live = first.values.get("torch_allocated", 0)
    high = second.values.get("torch_allocated_high_water")
    print("torch's peak after the sampler's resets (a profile allocates and frees "
          f"{gib(ACTIVATION_BYTES)} on top of {gib(live)} of live tensors):")  # fmt: skip
    print("| measurement | peak rise the profile reads | sampler's high-water mark after it |")
    print("|---|---:|---:|")
    print(f"| profile between two samples | {gib(between)} | {gib(high)} |")
    print(f"| profile with a sample inside it, resets not held | {gib(inside)} | |")
    print(
        f"| profile with a sample inside it, resets held (the hook, around determine_available_memory) | {gib(held)} | |"
    )
    print()
    if held != ACTIVATION_BYTES:
        problems.append(f"a profile with a sample inside it, resets held, read a peak rise of {held}")
    if between != ACTIVATION_BYTES:
        problems.append(f"a profile between two samples read a peak rise of {between}, not {ACTIVATION_BYTES}")
    if high is None or high < live + ACTIVATION_BYTES:
        problems.append(f"the sampler's high-water mark after the profile is {high}, below {live + ACTIVATION_BYTES}")


def mig_mode(nvml: Any, handle: Any) -> str:
    """The device's MIG mode as NVML reports it (current and pending), or why it cannot be read."""
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception as error:
        return f"not reported ({error})"
    names = {
        getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1): "enabled",
        getattr(nvml, "NVML_DEVICE_MIG_DISABLE", 0): "disabled",
    }
    return f"{names.get(current, current)} (pending {names.get(pending, pending)})"


def report_nvml(device: torch.device) -> None:
    """NVML's view of the device: its name, MIG mode and process list, and whether this PID is in it."""
    nvml = load_nvml()
    device_id = physical_device_id(device)
    if nvml is None or device_id is None:
        return
    try:
        handle = (
            nvml.nvmlDeviceGetHandleByUUID(device_id)
            if isinstance(device_id, str)
            else nvml.nvmlDeviceGetHandleByIndex(device_id)
        )
        processes = [(p.pid, p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    except Exception as error:
        print(f"NVML: device {device_id} cannot be read ({error})\n")
        return
    listed = ", ".join(f"{pid}: {gib(used) if isinstance(used, int) else used}" for pid, used in processes)
    print(f"NVML: device {device_id}; MIG mode {mig_mode(nvml, handle)}")
    print(f"NVML: compute processes {{{listed}}}; this process's PID {os.getpid()} "
          f"{'is' if any(pid == os.getpid() for pid, _ in processes) else 'is not'} listed\n")  # fmt: skip


def run_case(case: Case, device: torch.device, spool: Path) -> dict[str, Any]:
    """Publish one engine: baseline before its caches, a sample after filling them."""
    owner: owners.DemoOwner = getattr(owners, case.owner)()
    owner.to(device=device, dtype=case.dtype or owner.dtype)
    model = nn.Module()
    model.add_module("owner", owner)
    sampler = sampler_for(device)
    if not case.own_pid and isinstance(sampler, CudaSampler):
        sampler.pid = int(Path("/proc/sys/kernel/pid_max").read_text())
    snapshot = build_snapshot(
        model,
        max_num_seqs=case.max_num_seqs,
        engine_id=case.engine_id,
        served_model_name="gpu-truth",
        architecture=case.owner,
        device=str(physical_device_id(device)) if device.type == "cuda" else device.type,
    )
    observer = install(declaring_owners(model), enabled=True)
    publisher = SnapshotPublisher(spool, snapshot)
    synchronize(device)
    publisher.set_baseline(sampler())
    requested_before = requested_bytes(device)
    with torch.device(device):
        owner.allocate(case.max_num_seqs)
    synchronize(device)
    publisher.beat(sampler(), observer.sample())
    requested_after = requested_bytes(device)
    observer.uninstall()  # one engine per process in production; here the next case installs its own
    held, sizes = storage_bytes(owner)
    counters = list(layer_storages(owner, kv=False).values())
    requested = None if requested_before is None or requested_after is None else requested_after - requested_before
    return {
        "case": case,
        "owner": owner,
        "declared": snapshot.declared_peak_bytes,
        "held": held,
        "sizes": sizes + counters,
        "counters": sum(counters),
        "requested": requested,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(spool: Path) -> str:
    """Serve ``spool`` with the real sidecar app in a thread and return one /metrics body."""
    port = free_port()
    server = build_server(SidecarConfig(spool), host="127.0.0.1", port=port, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    return str(response.read().decode())
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def samples(text: str) -> dict[str, dict[str, float]]:
    """Sample values by metric name, then by engine (and source or owner where the series has one)."""
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = "/".join(sample.labels.get(k, "") for k in ("engine", "source", "owner")).rstrip("/")
            found.setdefault(sample.name, {})[key] = sample.value
    return found


def gib(value: float | None) -> str:
    return "absent" if value is None else f"{value / 2**20:,.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--expect-nvml",
        choices=("present", "absent", "any"),
        default="any",
        help="check that every engine exports NVML's process figure (present) or that none does (absent)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if on_cuda else "no CUDA device (torch.cuda.is_available() is False)"
    print(f"device: {device} — {name}; torch {torch.__version__}")

    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="modelkv-gpu-truth-") as spool_name:
        spool = Path(spool_name)
        results = [run_case(case, device, spool) for case in CASES]
        metrics = samples(scrape(spool))

    def value(metric: str, engine: str, extra: str = "") -> float | None:
        return metrics.get(metric, {}).get(f"{engine}/{extra}" if extra else engine)

    def growth(source: str, engine: str) -> float | None:
        now, base = (
            value(f"modelkv_memory_{source}_bytes", engine),
            value(f"modelkv_memory_{source}_baseline_bytes", engine),
        )
        return None if now is None or base is None else now - base

    print("| engine | declared peak | caches' storage | layers' counters | torch requested growth | torch allocated growth "
          "| torch reserved growth | NVML process | device used / total | process RSS growth | observed peak |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for result in results:
        engine = result["case"].engine_id
        observed = [v for k, v in metrics.get("modelkv_observed_peak_bytes", {}).items() if k.startswith(engine + "/")]
        used, total = (
            value("modelkv_memory_device_used_bytes", engine),
            value("modelkv_memory_device_total_bytes", engine),
        )
        print(
            f"| {engine} | {gib(result['declared'])} | {gib(result['held'])} | {result['counters']} B "
            f"| {gib(result['requested'])} "
            f"| {gib(growth('torch_allocated', engine))} "
            f"| {gib(growth('torch_reserved', engine))} | {gib(value('modelkv_memory_process_gpu_bytes', engine))} "
            f"| {gib(used)} / {gib(total)} | {gib(growth('process_resident', engine))} "
            f"| {gib(sum(observed)) if observed else 'not observed'} |"
        )
        if on_cuda:
            allocated = growth("torch_allocated", engine)
            slack = allocator_slack(result["sizes"])
            if allocated is None or not result["held"] <= allocated <= result["held"] + result["counters"] + slack:
                problems.append(
                    f"{engine}: torch_allocated grew {allocated} bytes; the caches hold {result['held']} "
                    f"(+ up to {slack} of the allocator's rounding and unsplit blocks)"
                )
            if result["requested"] != result["held"] + result["counters"]:
                problems.append(
                    f"{engine}: the allocator was asked for {result['requested']} bytes, the caches hold "
                    f"{result['held']} in keys and values and {result['counters']} in counters"
                )
        if observed and sum(observed) != result["held"]:
            problems.append(f"{engine}: observed {sum(observed)} bytes, the caches hold {result['held']}")
        if not observed and metrics.get("modelkv_observation_available", {}).get(f"{engine}//owner") != 0:
            problems.append(f"{engine}: no observed figure, yet observation is not reported unavailable")
        if result["held"] != result["declared"]:
            problems.append(f"{engine}: declared {result['declared']} bytes, the caches hold {result['held']}")
        nvml_figure = value("modelkv_memory_process_gpu_bytes", engine)
        nvml_available = value("modelkv_memory_measurement_available", engine, "process_gpu")
        if not result["case"].own_pid:
            if nvml_figure is not None or nvml_available != 0:
                problems.append(
                    f"{engine}: NVML lists no such PID, yet its figure is {nvml_figure} (available {nvml_available})"
                )
        elif args.expect_nvml == "present":
            reserved = value("modelkv_memory_torch_reserved_bytes", engine) or 0
            if nvml_figure is None or nvml_available != 1 or nvml_figure < reserved:
                problems.append(f"{engine}: NVML's process figure is {nvml_figure} (available {nvml_available}), "
                                f"expected one of at least torch's reserved {reserved}")  # fmt: skip
        elif args.expect_nvml == "absent" and (nvml_figure is not None or nvml_available != 0):
            problems.append(
                f"{engine}: NVML's process figure is {nvml_figure} (available {nvml_available}), expected absent"
            )
        for measurement in MEASUREMENTS:
            available = value("modelkv_memory_measurement_available", engine, measurement.source)
            figure = value(f"modelkv_memory_{measurement.source}_bytes", engine)
            if available == 0 and figure is not None:
                problems.append(f"{engine}: {measurement.source} is unavailable but exported as {figure}")
            if figure is not None and figure <= 0:
                problems.append(f"{engine}: {measurement.source} exported as {figure}")
            if not on_cuda and measurement.source != "process_resident" and available != 0:
                problems.append(f"{engine}: {measurement.source} should be absent without CUDA")
    print()
    absence = nvml_absence(device)
    print(f"NVML per-process figure for this PID: {'present' if absence is None else 'absent: ' + absence}")
    if on_cuda:
        report_nvml(device)
        check_peak_after_resets(device, problems)
    for problem in problems:
        print(f"FAIL {problem}")
    print("all checks passed" if not problems else f"{len(problems)} check(s) failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
