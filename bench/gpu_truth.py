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
- without CUDA, the CUDA and NVML sources are reported absent.

Any machine:   .venv/bin/python bench/gpu_truth.py
GPU machine without FastAPI/uvicorn (the device tool's README): carry the missing wheels,
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \\
      fastapi starlette uvicorn httptools pydantic pydantic-core annotated-types typing-inspection
then on the machine: pip install --no-index --no-deps --target /tmp/site .whl/*.whl; PYTHONPATH=/tmp/site:. python3 bench/gpu_truth.py
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from torch import nn  # noqa: E402
from transformers import EncoderDecoderCache  # noqa: E402

from modelkv_exporter.contract.vocabulary import MEASUREMENTS  # noqa: E402
from modelkv_exporter.demo import owners  # noqa: E402
from modelkv_exporter.engine.heartbeat import SnapshotPublisher  # noqa: E402
from modelkv_exporter.engine.observe import install  # noqa: E402
from modelkv_exporter.engine.protocol import declaring_owners  # noqa: E402
from modelkv_exporter.engine.publish import build_snapshot  # noqa: E402
from modelkv_exporter.engine.samplers import load_nvml, nvml_process_bytes, physical_device_id, sampler_for  # noqa: E402
from modelkv_exporter.sidecar.http.app import SidecarConfig  # noqa: E402
from modelkv_exporter.sidecar.http.server import build_server  # noqa: E402

ALLOCATOR_GRANULE = 512
"""The CUDA caching allocator rounds every allocation up to a multiple of 512 bytes."""


@dataclass(frozen=True)
class Case:
    """One engine: a demo owner class, the dtype it runs in, and its max_num_seqs."""

    engine_id: str
    owner: str
    dtype: torch.dtype | None
    max_num_seqs: int


CASES = (
    Case("codec-fp32", "CodecDecoder", None, 4),
    Case("local-bf16", "LocalTransformer", None, 8),
    Case("local-fp32", "LocalTransformer", torch.float32, 2),
    Case("whisper-bf16", "WhisperStreamingEncoder", None, 1),
    Case("talker-bf16", "TalkerGenerator", None, 1),
    Case("talker-fp16", "TalkerGenerator", torch.float16, 1),
)


def storage_bytes(owner: owners.DemoOwner) -> tuple[int, int]:
    """The distinct storage bytes the owner's caches hold, and how many storages (tensors) that is."""
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
                    for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                        if isinstance(tensor, torch.Tensor) and tensor.numel():
                            storage = tensor.untyped_storage()
                            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values()), len(storages)


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
        return "this PID is not in NVML's process list (no host PID namespace?)"
    return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_case(case: Case, device: torch.device, spool: Path) -> dict[str, Any]:
    """Publish one engine: baseline before its caches, a sample after filling them."""
    owner: owners.DemoOwner = getattr(owners, case.owner)()
    owner.to(device=device, dtype=case.dtype or owner.dtype)
    model = nn.Module()
    model.add_module("owner", owner)
    sampler = sampler_for(device)
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
    with torch.device(device):
        owner.allocate(case.max_num_seqs)
    synchronize(device)
    publisher.beat(sampler(), observer.sample())
    observer.uninstall()  # one engine per process in production; here the next case installs its own
    held, tensors = storage_bytes(owner)
    return {"case": case, "owner": owner, "declared": snapshot.declared_peak_bytes, "held": held, "tensors": tensors}


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
    args = parser.parse_args()
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if on_cuda else "no CUDA device (torch.cuda.is_available() is False)"
    print(f"device: {device} — {name}; torch {torch.__version__}")
    absence = nvml_absence(device)
    print(f"NVML per-process figure: {'present' if absence is None else 'absent: ' + absence}\n")

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

    print("| engine | declared peak | caches' storage | torch allocated growth | torch reserved growth "
          "| NVML process | device used / total | process RSS growth | observed peak |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for result in results:
        engine = result["case"].engine_id
        observed = [v for k, v in metrics.get("modelkv_observed_peak_bytes", {}).items() if k.startswith(engine + "/")]
        used, total = (
            value("modelkv_memory_device_used_bytes", engine),
            value("modelkv_memory_device_total_bytes", engine),
        )
        print(
            f"| {engine} | {gib(result['declared'])} | {gib(result['held'])} | {gib(growth('torch_allocated', engine))} "
            f"| {gib(growth('torch_reserved', engine))} | {gib(value('modelkv_memory_process_gpu_bytes', engine))} "
            f"| {gib(used)} / {gib(total)} | {gib(growth('process_resident', engine))} "
            f"| {gib(sum(observed)) if observed else 'not observed'} |"
        )
        if on_cuda:
            allocated = growth("torch_allocated", engine)
            rounding = ALLOCATOR_GRANULE * result["tensors"]
            if allocated is None or not result["held"] <= allocated <= result["held"] + rounding:
                problems.append(
                    f"{engine}: torch_allocated grew {allocated} bytes; the caches hold {result['held']} "
                    f"(+ up to {rounding} of rounding)"
                )
        if observed and sum(observed) != result["held"]:
            problems.append(f"{engine}: observed {sum(observed)} bytes, the caches hold {result['held']}")
        if not observed and metrics.get("modelkv_observation_available", {}).get(f"{engine}//owner") != 0:
            problems.append(f"{engine}: no observed figure, yet observation is not reported unavailable")
        if result["held"] != result["declared"]:
            problems.append(f"{engine}: declared {result['declared']} bytes, the caches hold {result['held']}")
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
    for problem in problems:
        print(f"FAIL {problem}")
    print("all checks passed" if not problems else f"{len(problems)} check(s) failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
