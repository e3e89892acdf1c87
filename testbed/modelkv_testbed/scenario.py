"""A spool with every situation the rules and dashboards watch for, beside the demo's engines.

Real parts: the demo's engine processes (real transformers caches, CPU memory), the
real ``SnapshotPublisher`` and its heartbeat thread, and ``build_snapshot`` collecting a real
torch model whose declarer raises. The one stand-in is the GPU: the simulated engines' sampler
reports CUDA and NVML figures no machine here can measure, and they say so in their ``writer``.

The simulated engines:

- ``sim-gpu-leak``, alone on its device, started two hours ago and serving full-size prefills (its
  activations reach the profiled peak in every sample window): its live tensors grow (``live``);
  its device fills up steadily (the exhaustion prediction);
- ``sim-gpu-plateau``, alone on its device: served a full-size prefill, so torch's caching allocator,
  NVML and the device hold 1 GiB more for good, while its live tensors peak within the activation
  peak vLLM profiled. Nothing is undeclared;
- ``sim-gpu-tight`` and ``sim-gpu-tight-peer`` share one device with 4 GiB free; each has 3 GiB of
  declared cache still to allocate: either alone would fit, both do not;
- ``sim-dropped``: a model whose declarer raises, published through ``build_snapshot``;
- ``sim-shrinking``: declares two caches, then (``shrink``) one;
- ``sim-stale`` (missed its heartbeats long ago) and ``corrupt.json``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torch import nn

from modelkv_exporter.contract.snapshot import EngineSettings, MemorySample, Snapshot
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_testbed.snapshots import make_declaration, make_snapshot

GIB = 1024**3
MAX_NUM_SEQS = 8
DEVICE_TOTAL = 80 * GIB
LIVE_AT_BASELINE = 19 * GIB
RESERVED_AT_BASELINE = 20 * GIB
CONTEXT = 2 * GIB
PROFILED_ACTIVATION_PEAK = GIB + GIB // 4
"""The activation peak vLLM profiled for every simulated engine: the high-water baseline's headroom."""
WRITER = "tests (simulated GPU)"


def gpu_declarations() -> tuple:
    """A 512 MiB-a-row per-request cache (4 GiB at max_num_seqs 8) and a fixed 1 GiB pool."""
    geometry: dict[str, Any] = {"layers": 32, "kv_heads": 8, "head_dim": 128, "positions": 4096, "element_size": 2}
    return (
        make_declaration("talker_kv", owner="talker", max_num_seqs=MAX_NUM_SEQS, **geometry),
        make_declaration(
            "graph_pool",
            owner="talker",
            rows="fixed",
            rows_fixed=2,
            scope="model",
            max_num_seqs=MAX_NUM_SEQS,
            capacity_source="captured batch sizes (1, 2)",
            **geometry,
        ),
    )


def declared_peak() -> int:
    """Declared peak bytes of one simulated engine."""
    return sum(d.peak_bytes for d in gpu_declarations())


@dataclass
class SimulatedGpuEngine:
    """One engine on a simulated GPU, as torch.cuda and NVML would measure it; change the fields under ``lock``.

    ``live`` is the growth of live tensors since the baseline (declared caches included),
    ``activation`` the transient peak of each sample window on top of them, ``cached`` what
    torch's caching allocator keeps beyond the live tensors (freed activations, fragmentation),
    ``non_torch`` device memory outside torch grown since the baseline.
    """

    engine_id: str
    device: str
    device_used: int
    live: int = 0
    activation: int = 0
    cached: int = 0
    non_torch: int = 0
    device_rise_per_beat: int = 0
    beats: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self) -> MemorySample:
        """One heartbeat's sample (the device fills a little more each beat)."""
        with self.lock:
            self.beats += 1
            live = LIVE_AT_BASELINE + self.live
            reserved = RESERVED_AT_BASELINE + max(self.live, 0) + self.cached
            values = {
                "torch_allocated": live,
                "torch_allocated_high_water": live + self.activation,
                "torch_peak_allocated": LIVE_AT_BASELINE + PROFILED_ACTIVATION_PEAK + max(self.live, 0),
                "torch_reserved": reserved,
                "process_gpu": reserved + CONTEXT + self.non_torch,
                "device_used": min(self.device_used + self.beats * self.device_rise_per_beat, DEVICE_TOTAL),
                "device_total": DEVICE_TOTAL,
            }
            return MemorySample(time.time(), values)

    def baseline(self) -> MemorySample:
        """The post-initialisation sample: live tensors plus the profiled activation peak as high-water baseline."""
        with self.lock:
            values = {
                "torch_allocated": LIVE_AT_BASELINE,
                "torch_allocated_high_water": LIVE_AT_BASELINE + PROFILED_ACTIVATION_PEAK,
                "torch_reserved": RESERVED_AT_BASELINE,
                "process_gpu": RESERVED_AT_BASELINE + CONTEXT,
                "device_used": self.device_used,
                "device_total": DEVICE_TOTAL,
            }
            return MemorySample(time.time(), values)


class RaisingDeclarer(nn.Module):
    """A cache owner whose declaration is broken: ``model_local_kv_specs()`` raises."""

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        raise KeyError("num_key_value_heads")


class WorkingDeclarer(nn.Module):
    """A cache owner that declares one per-request cache."""

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        import torch

        return [
            ModelLocalKVSpec(
                name="codec_kv",
                layers=8,
                kv_heads=8,
                head_dim=64,
                dtype=torch.bfloat16,
                physical_capacity_positions=512,
                capacity_source="codec window",
                scope=ModelLocalKVScope.REQUEST,
                rows=RowDriver.MAX_NUM_SEQS,
            )
        ]


def dropping_model() -> nn.Module:
    """A model with one working declarer and one that raises."""
    model = nn.Module()
    model.codec = WorkingDeclarer()
    model.talker = nn.Module()
    model.talker.decoder = RaisingDeclarer()
    return model


@dataclass
class Scenario:
    """The simulated engines beside the demo's, and what to stop."""

    leak: SimulatedGpuEngine
    plateau: SimulatedGpuEngine
    tight: SimulatedGpuEngine
    peer: SimulatedGpuEngine
    shrinking: SnapshotPublisher
    publishers: list[SnapshotPublisher]

    def shrink(self) -> None:
        """``sim-shrinking`` loses one of its two declarations (a declarer that stopped declaring, silently)."""
        self.shrinking.update(lambda s: replace(s, declarations=s.declarations[:1]))

    def stop(self) -> None:
        """End every simulated engine's snapshot."""
        for publisher in self.publishers:
            publisher.end()


def _gpu_snapshot(engine: SimulatedGpuEngine, stage: int, started_at: float) -> Snapshot:
    snapshot = make_snapshot(
        engine.engine_id,
        declarations=gpu_declarations(),
        max_num_seqs=MAX_NUM_SEQS,
        served_model_name="sim-gpu-omni",
        stage_id=stage,
        stage_name=("talker", "code2wav", "thinker", "vocoder")[stage],
        device=engine.device,
    )
    settings = EngineSettings(
        max_num_seqs=MAX_NUM_SEQS, gpu_memory_utilization=0.7, paged_kv_bytes=30 * GIB, paged_kv_blocks=1920
    )
    return replace(snapshot, settings=settings, writer=WRITER, started_at=started_at, dropped_declarations=())


def start_scenario(spool: Path, interval: float = 0.5) -> Scenario:
    """Publish the simulated engines, a stale engine and a corrupt file into ``spool``.

    ``leak`` starts with half its declared peak in live tensors; ``tight`` and its peer have
    allocated 2 GiB of their 5 GiB declared peaks, on a device with 4 GiB free.
    """
    now = time.time()
    leak = SimulatedGpuEngine("sim-gpu-leak", "GPU-51a1ea4e-0000-4000-8000-000000000001", 30 * GIB)
    leak.live, leak.activation = declared_peak() // 2, PROFILED_ACTIVATION_PEAK
    leak.device_rise_per_beat = GIB // 64
    plateau = SimulatedGpuEngine("sim-gpu-plateau", "GPU-51a1ea4e-0000-4000-8000-000000000002", 40 * GIB)
    plateau.activation, plateau.cached = GIB, GIB
    shared = "GPU-51a1ea4e-0000-4000-8000-000000000003"
    tight = SimulatedGpuEngine("sim-gpu-tight", shared, DEVICE_TOTAL - 4 * GIB, live=2 * GIB)
    peer = SimulatedGpuEngine("sim-gpu-tight-peer", shared, DEVICE_TOTAL - 4 * GIB, live=2 * GIB)
    publishers = []
    for stage, engine in enumerate((leak, plateau, tight, peer)):
        started_at = now - 2 * 3600 if engine is leak else now
        publisher = SnapshotPublisher(spool, _gpu_snapshot(engine, stage, started_at))
        publisher.set_baseline(engine.baseline())
        publisher.start_heartbeat(interval, engine.sample)
        publishers.append(publisher)

    dropped = build_snapshot(dropping_model(), max_num_seqs=4, engine_id="sim-dropped", served_model_name="sim-drop")
    shrinking = make_snapshot("sim-shrinking", declarations=gpu_declarations(), served_model_name="sim-shrink")
    for snapshot in (dropped, replace(shrinking, dropped_declarations=())):
        publisher = SnapshotPublisher(spool, snapshot)
        publisher.start_heartbeat(interval)
        publisher.write()
        publishers.append(publisher)

    write_snapshot(spool, make_snapshot("sim-stale", heartbeat_at=time.time() - 600, interval=1.0))
    (spool / "corrupt.json").write_text('{"schema_version": 1, "engine": ')
    return Scenario(leak, plateau, tight, peer, publishers[-1], publishers)


def start_replica(spool: Path, interval: float = 0.5) -> SnapshotPublisher:
    """``sim-replica`` in ``spool``: another pod's spool holds an engine of the same id (a replica pod)."""
    snapshot = make_snapshot("sim-replica", declarations=gpu_declarations(), served_model_name="sim-replicated")
    publisher = SnapshotPublisher(spool, replace(snapshot, dropped_declarations=()))
    publisher.start_heartbeat(interval)
    publisher.write()
    return publisher
