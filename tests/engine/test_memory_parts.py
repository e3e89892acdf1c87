"""Where a device engine's memory goes, through the real hook on a stand-in vLLM 0.34 worker whose every byte is known.

The hook records vLLM's figures (``model_memory_usage``, ``peak_activation_memory`` less the graph
estimate, what ``capture_model`` returned) once, at the steps that set them; the sidecar splits the
process's device bytes with them (``sidecar/breakdown.py``), and each part is checked against the
stand-in device's own books: weights, the committed KV pages, the graph pool, the activation
reserve, the CUDA context. The parts are read back from the samples the sidecar exports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.engine.vllm_hook import memory_parts
from modelkv_exporter.sidecar import breakdown as breakdown_module
from modelkv_exporter.sidecar.samples import engine_samples
from tests.engine.extensible_stand_in import GIB, MIB, kv_cache_config, run_engine_core
from tests.engine.test_extensible_kv import CAPACITY, STRIDES, Engine, engines

FINAL_BLOCKS = 250_000


def exported_parts(snapshot: Snapshot) -> dict[str, float]:
    """The ``modelkv_memory_breakdown_bytes`` samples the sidecar exports for ``snapshot``, by component."""
    parts: dict[str, float] = {}

    def add(name: str, labels: list[str], value: float) -> None:
        if name == "modelkv_memory_breakdown_bytes":
            assert labels[-1] not in parts, f"{labels[-1]} exported twice"
            parts[labels[-1]] = value

    engine_samples(snapshot, False, add, lambda name, labels: None, 16)
    return parts


def assert_parts_sum(snapshot: Snapshot, process_bytes: int) -> dict[str, float]:
    """The exported parts are complete and add up to ``process_bytes`` (the tolerance is the breakdown's)."""
    parts = exported_parts(snapshot)
    assert "unexplained" in parts, f"incomplete breakdown: {sorted(parts)}"
    assert abs(sum(parts.values()) - process_bytes) <= breakdown_module.TOLERANCE_BYTES, parts
    return parts


def books(e: Engine) -> dict[str, int]:
    """Each part as the stand-in device holds it: what the worker loaded, mapped, captured and profiled."""
    return {
        "weights": e.worker.weights,
        "paged_kv": e.cache.physical_bytes,
        "cuda_graphs": e.worker.graph_pool,
        "activation_peak": e.worker.activation_peak,
        "model_local_caches": 0,
        "non_torch": e.gpu.context,
        "unexplained": 0,
    }


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Engine]]:
    yield from engines(tmp_path, monkeypatch, device_type="cuda", graph_estimate=320 * MIB)


def test_each_part_of_an_extensible_engine_is_what_its_device_holds(engine: Any) -> None:
    e = engine()
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), FINAL_BLOCKS)
    parts = assert_parts_sum(e.beat(), e.gpu.process_bytes)
    assert parts == books(e), "vLLM's graph estimate (320 MiB) is taken out of the activation peak"


def test_across_sleep_and_wake_the_parts_still_sum_and_the_kv_part_follows_the_pages(engine: Any) -> None:
    e = engine()
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), FINAL_BLOCKS)
    e.worker.sleep()
    asleep = assert_parts_sum(e.beat(), e.gpu.process_bytes)
    assert asleep["paged_kv"] == 0 and asleep["unexplained"] == 0
    e.worker.wake_up()
    assert assert_parts_sum(e.beat(), e.gpu.process_bytes)["paged_kv"] == e.cache.physical_bytes


def test_a_leak_shows_as_unexplained_even_inside_the_allocator_s_free_blocks(engine: Any) -> None:
    e = engine()
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), FINAL_BLOCKS)
    e.gpu.allocate(GIB)
    parts = assert_parts_sum(e.beat(), e.gpu.process_bytes)
    assert parts["unexplained"] == GIB, "a live GiB no part names, though it sits in the allocator's free blocks"
    assert parts["activation_peak"] == GIB, "what is left of the free blocks for activations"
    e.gpu.allocate(2 * GIB)
    parts = assert_parts_sum(e.beat(), e.gpu.process_bytes)
    assert (parts["unexplained"], parts["activation_peak"]) == (3 * GIB, 0)


def test_a_torch_allocated_kv_cache_and_an_eager_engine(engine: Any) -> None:
    e = engine(extensible=False)
    e.worker.vllm_config.model_config.enforce_eager = True
    size = CAPACITY * sum(STRIDES)
    config = SimpleNamespace(
        num_blocks=CAPACITY, segment_strides=STRIDES, kv_cache_tensors=[SimpleNamespace(size=size, layer_stride=1)]
    )
    run_engine_core(e.worker, config, FINAL_BLOCKS)
    parts = assert_parts_sum(e.beat(), e.gpu.process_bytes)
    assert parts["paged_kv"] == size and parts["cuda_graphs"] == 0, "eager: no graphs, a known 0"
    assert parts["unexplained"] == 0 and parts["non_torch"] == e.gpu.context


def test_before_the_graphs_are_captured_that_part_and_the_rest_are_absent(engine: Any) -> None:
    e = engine()
    e.worker.load_model()
    parts = exported_parts(e.beat())
    assert parts["weights"] == 4 * GIB and parts["non_torch"] == e.gpu.context
    assert "cuda_graphs" not in parts and "unexplained" not in parts, "unknown is absent, never 0"


def test_a_part_left_out_of_the_export_fails_the_sum(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sum check can fail: a component forgotten in the table still counts in the rest, and the sum is short."""
    e = engine()
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), FINAL_BLOCKS)
    names = tuple(name for name in breakdown_module.COMPONENT_NAMES if name != "non_torch")
    monkeypatch.setattr(breakdown_module, "COMPONENT_NAMES", names)
    with pytest.raises(AssertionError):
        assert_parts_sum(e.beat(), e.gpu.process_bytes)


def test_model_local_caches_counted_twice_break_the_parts(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting once matters: bytes counted twice still sum (they come out of the activation reserve), but the
    parts are no longer the device's books."""
    e = engine()
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), FINAL_BLOCKS)
    monkeypatch.setattr(breakdown_module, "model_local_bytes", lambda snapshot: 64 * MIB)
    parts = assert_parts_sum(e.beat(), e.gpu.process_bytes)
    assert parts != books(e) and parts["activation_peak"] == e.worker.activation_peak - 64 * MIB


def test_the_capture_wrapper_returns_what_vllm_returns_and_survives_a_failing_record() -> None:
    class Runner:
        def capture_model(self, *, profile_only: bool = False) -> int:
            return 7

    worker = SimpleNamespace(model_runner=Runner())
    seen: list[int] = []
    assert memory_parts.record_graph_capture(worker, seen.append)
    assert not memory_parts.record_graph_capture(worker, seen.append), "wrapped once"
    assert worker.model_runner.capture_model(profile_only=True) == 7 and seen == [], "a measuring pass"
    assert worker.model_runner.capture_model() == 7 and seen == [7]

    def fail(size: int) -> None:
        raise RuntimeError("ours")

    other = SimpleNamespace(model_runner=Runner())
    memory_parts.record_graph_capture(other, fail)
    assert other.model_runner.capture_model() == 7


@pytest.mark.parametrize(("flag", "expected"), [("1", 2 * GIB), ("0", 2 * GIB + 320 * MIB), ("x", None)])
def test_the_graph_estimate_is_taken_out_only_where_vllm_added_it(
    flag: str, expected: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(memory_parts.ESTIMATE_FLAG, flag)
    worker = SimpleNamespace(peak_activation_memory=2 * GIB + 320 * MIB, cudagraph_memory_estimate=320 * MIB)
    assert memory_parts.activation_peak_bytes(worker) == expected
