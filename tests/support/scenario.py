"""A spool with every situation the rules and dashboards watch for, beside the demo's engines.

Real parts: the demo's engine processes (real transformers caches, CPU memory), the
real ``SnapshotPublisher`` and its heartbeat thread. The one stand-in is the GPU: the
simulated engines' sampler reports CUDA and NVML figures no machine here can measure,
and they say so in their identity (``device``) and ``writer``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from modelkv_exporter.contract.snapshot import EngineSettings, MemorySample
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from tests.support.snapshots import make_declaration, make_snapshot

GIB = 1024**3
MAX_NUM_SEQS = 8
DEVICE_TOTAL = 80 * GIB


def gpu_declarations() -> tuple:
    """A 512 MiB-a-row per-request cache (4 GiB at max_num_seqs 8) and a fixed 1 GiB pool."""
    geometry = {"layers": 32, "kv_heads": 8, "head_dim": 128, "positions": 4096, "element_size": 2}
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


@dataclass
class SimulatedGpuEngine:
    """One engine on a simulated GPU; set ``growth`` (bytes since the baseline) to move its memory."""

    engine_id: str
    growth: int
    device_used: int
    device_rise_per_beat: int = 0
    beats: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self) -> MemorySample:
        """What torch.cuda and NVML would report now (one heartbeat: the device fills a little more)."""
        with self.lock:
            self.beats += 1
            return self._measure(self.growth, self.beats)

    def baseline(self) -> MemorySample:
        """The post-initialisation sample: no growth yet, no beat counted."""
        with self.lock:
            return self._measure(0, self.beats)

    def _measure(self, growth: int, beats: int) -> MemorySample:
        device_used = min(self.device_used + beats * self.device_rise_per_beat, DEVICE_TOTAL)
        values = {
            "process_gpu": 22 * GIB + growth,
            "torch_reserved": 20 * GIB + growth,
            "torch_allocated": 19 * GIB + growth,
            "torch_peak_allocated": 19 * GIB + max(growth, 0),
            "device_used": device_used,
            "device_total": DEVICE_TOTAL,
        }
        return MemorySample(time.time(), values)


def declared_peak() -> int:
    """Declared peak bytes of one simulated engine."""
    return sum(d.peak_bytes for d in gpu_declarations())


@dataclass
class Scenario:
    """The simulated engines beside the demo's, and what to stop."""

    leak: SimulatedGpuEngine
    tight: SimulatedGpuEngine
    publishers: list[SnapshotPublisher]

    def stop(self) -> None:
        """End every simulated engine's snapshot."""
        for publisher in self.publishers:
            publisher.end()


def start_scenario(spool: Path, interval: float = 0.5) -> Scenario:
    """Publish the simulated engines, a stale engine and a corrupt file into ``spool``.

    ``leak`` starts with half its declared peak allocated on a device filling up fast;
    ``tight`` has allocated 2 GiB of its declared peak on a device with 1 GiB free.
    """
    leak = SimulatedGpuEngine("sim-gpu-leak", growth=declared_peak() // 2, device_used=30 * GIB)
    leak.device_rise_per_beat = GIB // 8
    tight = SimulatedGpuEngine("sim-gpu-tight", growth=2 * GIB, device_used=DEVICE_TOTAL - GIB)
    publishers = []
    for stage, engine in enumerate((leak, tight)):
        snapshot = make_snapshot(
            engine.engine_id,
            declarations=gpu_declarations(),
            max_num_seqs=MAX_NUM_SEQS,
            served_model_name="sim-gpu-omni",
            stage_id=stage,
            stage_name=("talker", "code2wav")[stage],
            device="cuda:0 (simulated)",
        )
        settings = EngineSettings(
            max_num_seqs=MAX_NUM_SEQS, gpu_memory_utilization=0.7, paged_kv_bytes=30 * GIB, paged_kv_blocks=1920
        )
        publisher = SnapshotPublisher(spool, replace(snapshot, settings=settings, writer="tests (simulated GPU)"))
        publisher.set_baseline(engine.baseline())
        publisher.start_heartbeat(interval, engine.sample)
        publishers.append(publisher)
    write_snapshot(spool, make_snapshot("sim-stale", heartbeat_at=time.time() - 600, interval=1.0))
    (spool / "corrupt.json").write_text('{"schema_version": 1, "engine": ')
    return Scenario(leak, tight, publishers)
