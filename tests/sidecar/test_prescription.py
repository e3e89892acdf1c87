"""The prescription's edges: each figure it cannot compute is absent with its reason, never 0; it shows on the page
and in the JSON document; a discovered owner two methods found is counted once."""

from __future__ import annotations

import math
from dataclasses import replace
from html import unescape
from pathlib import Path

from modelkv_exporter.contract.snapshot import DiscoveredOwner, EngineSettings, Snapshot
from modelkv_exporter.contract.thresholds import PRESCRIPTION_MARGIN_RATIO
from modelkv_exporter.sidecar.capacity import Demand
from modelkv_exporter.sidecar.prescription import FLAG, prescription
from modelkv_exporter.sidecar.presentation.page import render_page
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.reader.state import classify
from modelkv_testbed.snapshots import make_snapshot
from tests.support.engines_document import engines_document

GOLDEN = Path(__file__).parent / "golden" / "memory-breakdown"
GIB = 1024**3
HOST = {"process_resident": 3 * GIB}


def _golden(engine_id: str) -> Snapshot:
    return next(s for _, s in SpoolReader(GOLDEN).scan().snapshots if s.engine.engine_id == engine_id)


def _host(**settings: int | float | None) -> Snapshot:
    snapshot = make_snapshot(declarations=(), measured=HOST, baseline=HOST)
    fields = {"runtime_bytes": GIB, "weights_bytes": GIB // 2, **settings}
    return replace(snapshot, settings=EngineSettings(max_num_seqs=8, **fields))  # type: ignore[arg-type]


def test_a_host_engine_is_prescribed_its_requested_memory_less_its_process_figure_and_the_margin() -> None:
    found = prescription(_host(requested_memory_bytes=8 * GIB))
    margin = math.ceil(8 * GIB * PRESCRIPTION_MARGIN_RATIO)
    assert found.kv_cache_bytes == 8 * GIB - 3 * GIB - margin
    assert found.flag == f"--kv-cache-memory-bytes={8 * GIB - 3 * GIB - margin}"
    assert found.needs == {"runtime": GIB, "weights": GIB // 2, "model_local_caches": 0, "unexplained": 3 * GIB // 2}
    assert found.chosen_kv_bytes is None and found.difference is None
    assert found.gpu_memory_utilization is None and found.utilization_reason is not None


def test_without_a_requested_memory_the_prescription_is_absent_with_its_reason_never_zero() -> None:
    found = prescription(_host())
    assert found.kv_cache_bytes is None and found.flag is None and found.margin is None
    assert found.requested.bytes is None and found.requested.source == found.reason
    assert found.reason is not None and found.reason.startswith("no total memory")
    device = replace(
        _host(),
        measured=replace(
            _host().measured, current=replace(_host().measured.current, values={**HOST, "device_total": 80 * GIB})
        ),
    )  # type: ignore[arg-type]
    assert prescription(device).reason == "no gpu_memory_utilization: the engine's share of its device is unknown"


def test_a_part_that_is_not_measured_leaves_the_prescription_absent_and_names_it() -> None:
    found = prescription(_host(requested_memory_bytes=8 * GIB, runtime_bytes=None))
    assert found.kv_cache_bytes is None
    assert found.reason == "a part of its memory is not measured; unknown: runtime, unexplained"


def test_the_golden_vllm_034_engine_is_prescribed_from_its_own_figures() -> None:
    """Its requested memory (80 GiB at 1.0), its process figure less its committed KV cache, the activation allowance
    in place of torch's free blocks, its caches at their peaks in place of what they hold: every figure read from the file."""
    snapshot = _golden("qwen3-vllm034-dp0")
    values = snapshot.measured.current.values  # type: ignore[union-attr]
    s = snapshot.settings
    free_blocks = values["torch_reserved"] - values["torch_allocated"] - (s.cuda_graph_free_bytes or 0)
    activation_allowance = max(s.activation_peak_bytes or 0, s.torch_headroom_bytes or 0)
    held = values["process_gpu"] - values["paged_kv_committed"] - min(free_blocks, activation_allowance)
    (observed,) = snapshot.observations
    (found_owner,) = snapshot.discovered
    assert observed.live_bytes is not None and observed.peak_bytes is not None
    live_caches = observed.live_bytes + found_owner.live_bytes
    assert observed.peak_bytes > snapshot.declared_peak_bytes, "observed above its declaration: its observed peak"
    peak_caches = observed.peak_bytes + found_owner.peak_bytes
    needs = held - live_caches + peak_caches + activation_allowance
    requested = 80 * GIB
    want = requested - needs - math.ceil(requested * PRESCRIPTION_MARGIN_RATIO)
    found = prescription(snapshot)
    assert found.requested.bytes == requested and found.kv_cache_bytes == want
    assert found.difference == want - s.paged_kv_bytes  # type: ignore[operator]
    assert found.headroom_bytes == s.torch_headroom_bytes + s.paged_kv_bytes - want  # type: ignore[operator]
    equivalent = (requested - s.paged_kv_bytes + want) / requested  # type: ignore[operator]
    assert equivalent > 1 and found.gpu_memory_utilization is None, "vLLM 0.34 sized to 1.0 already"
    assert found.utilization_reason == f"above 1 ({equivalent:.4f}): no share of the device gives it; use {FLAG}"


def test_an_owner_two_methods_found_is_counted_once_at_its_larger_peak() -> None:
    """Fails on the base: ``Demand.expected`` added both figures of one module's memory."""
    snapshot = make_snapshot(declarations=())
    found = (
        DiscoveredOwner("apm", "A", "cache_layer", 200 << 20, 0, 0),
        DiscoveredOwner("apm", "A", "census", 300 << 20, 0, 0),
    )
    from tests.support.discovered import discovery_status

    snapshot = replace(snapshot, discovered=found, discovery=discovery_status())
    assert Demand.expected(snapshot).peak_at(8) == 300 << 20


def test_the_page_and_the_document_show_the_flag(tmp_path: Path) -> None:
    scan = SpoolReader(GOLDEN).scan()
    view = classify(scan, 1800000001.0, 1e9, 0)
    want = prescription(_golden("qwen3-vllm034-dp0"))
    page = unescape(render_page(view, spool_dir="spool", version="test", max_discovered=10))
    assert f"<code>--kv-cache-memory-bytes={want.kv_cache_bytes}</code>" in page
    assert "What to give vLLM:" in page and "vLLM's start-up estimate" in page
    document = engines_document(view, "spool", 10)
    (entry,) = [e for e in document["engines"] if e["snapshot"]["engine"]["engine_id"] == "qwen3-vllm034-dp0"]
    assert entry["prescription"]["kv_cache_memory_bytes"] == want.kv_cache_bytes
    assert entry["prescription"]["flag"] == want.flag
    assert entry["prescription"]["requested_memory_bytes"] == want.requested.bytes
    assert entry["prescription"]["requested_memory_source"] == want.requested.source
    (older,) = [e for e in document["engines"] if e["snapshot"]["engine"]["engine_id"] == "before-breakdown-dp0"]
    assert older["prescription"]["kv_cache_memory_bytes"] is None and older["prescription"]["reason"]
