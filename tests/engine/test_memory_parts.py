"""Where a device engine's memory goes, through the real hook on a stand-in vLLM 0.34 worker whose every byte is known.

The hook records its figures once, at the steps that set them: the process figure after ``init_device``
(the runtime), vLLM's ``model_memory_usage``, the activation peak vLLM profiled less its graph estimate, the
bytes torch's private pools grew by across ``capture_model``, what vLLM keeps free for torch, and the sleep
allocator's books after each sleep and wake-up. The sidecar splits the process's device bytes with them
(``sidecar/breakdown.py``); each part is checked against the stand-in device's own books, read back from the
samples the sidecar exports. Then each part is broken on purpose, and the rest (``unexplained``, read from the
process figure) moves by what was broken, and by nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.engine.samplers import PrivatePools
from modelkv_exporter.engine.vllm_hook import memory_parts
from modelkv_exporter.sidecar import breakdown as breakdown_module
from modelkv_exporter.sidecar.samples import engine_samples
from tests.engine.extensible_stand_in import GIB, MIB, kv_cache_config, run_engine_core
from tests.engine.test_extensible_kv import CAPACITY, STRIDES, Engine, engines

FINAL_BLOCKS = 250_000


def exported(snapshot: Snapshot) -> dict[str, float]:
    """The samples the sidecar exports for ``snapshot``: the breakdown's parts by component, and the engine gauges
    this test reads (``sleep_level``, ``torch_headroom``)."""
    parts: dict[str, float] = {}

    def add(name: str, labels: list[str], value: float) -> None:
        if name == "modelkv_memory_breakdown_bytes":
            assert labels[-1] not in parts, f"{labels[-1]} exported twice"
            parts[labels[-1]] = value
        elif name in ("modelkv_engine_sleep_level", "modelkv_engine_torch_headroom_bytes"):
            parts[name] = value

    engine_samples(snapshot, False, add, lambda name, labels: None, 16)
    return parts


def exported_parts(snapshot: Snapshot) -> dict[str, float]:
    return {k: v for k, v in exported(snapshot).items() if not k.startswith("modelkv_")}


def books(e: Engine, **changes: int) -> dict[str, int]:
    """Each part as the stand-in device holds it: the context and the runner's buffers made before load, what the
    worker loaded, mapped, captured and profiled; nothing unexplained."""
    return {
        "runtime": e.gpu.context + e.worker.runtime_buffers,
        "weights": e.worker.weights,
        "paged_kv": e.cache.physical_bytes,
        "cuda_graphs": e.worker.graph_pool,
        "activation_peak": e.worker.activation_peak,
        "model_local_caches": 0,
        "unexplained": 0,
        **changes,
    }


def assert_complete(parts: dict[str, float], process_bytes: int) -> None:
    """No part is negative but the rest, and the rest is what the process holds beyond the others."""
    assert "unexplained" in parts, f"incomplete breakdown: {sorted(parts)}"
    assert all(value >= 0 for name, value in parts.items() if name != "unexplained"), parts
    assert sum(parts.values()) == process_bytes


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Engine]]:
    yield from engines(tmp_path, monkeypatch, device_type="cuda", graph_estimate=320 * MIB)


def started(engine: Callable[..., Engine], **worker: Any) -> Engine:
    e = engine(**worker)
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), FINAL_BLOCKS)
    return e


def test_each_part_of_an_extensible_engine_is_what_its_device_holds(engine: Any) -> None:
    e = started(engine)
    parts = exported_parts(e.beat())
    assert parts == books(e), "vLLM's graph estimate (320 MiB) is taken out of the activation peak"
    assert_complete(parts, e.gpu.process_bytes)


def test_a_neighbour_allocating_during_capture_leaves_the_graph_part_exact(engine: Any) -> None:
    """vLLM's ``capture_model`` returns the drop in the device's free memory: a neighbour committing 20 GiB during
    the capture gave the graphs 20.3 GiB against a 300 MiB pool, and the rest -20 GiB. Torch's own pools do not
    see the neighbour."""
    e = engine()

    def neighbour() -> None:
        e.gpu.neighbour += 20 * GIB

    e.worker.model_runner.during_capture.append(neighbour)
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), FINAL_BLOCKS)
    assert getattr(type(e.worker.model_runner).capture_model, memory_parts.WRAPPED, False), "the capture is wrapped"
    parts = exported_parts(e.beat())
    assert parts == books(e)
    assert e.hook.publisher.snapshot.settings.cuda_graph_bytes == 300 * MIB


def test_the_device_s_free_memory_as_the_graph_part_would_show_the_neighbour(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mechanism broken on purpose: the graph part taken from what ``capture_model`` returns (the device's free
    memory, as before) counts the neighbour, and the rest goes 20 GiB negative."""

    def returned_bytes(worker: Any, record: Callable[[memory_parts.GraphPools], None], pools: Any) -> bool:
        runner = worker.model_runner
        unbound = type(runner).capture_model

        def capture_model(**kwargs: Any) -> int:
            size: int = unbound(runner, **kwargs)
            record(memory_parts.GraphPools(size, runner.graph_pool_free))
            return size

        runner.capture_model = capture_model
        return True

    monkeypatch.setattr("modelkv_exporter.engine.vllm_hook.lifecycle.record_graph_capture", returned_bytes)
    e = engine()
    e.worker.model_runner.during_capture.append(lambda: setattr(e.gpu, "neighbour", e.gpu.neighbour + 20 * GIB))
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), FINAL_BLOCKS)
    parts = exported_parts(e.beat())
    assert parts["cuda_graphs"] == 20 * GIB + 300 * MIB and parts["unexplained"] == -20 * GIB


def test_memory_made_outside_torch_shows_in_the_rest_and_nowhere_else(engine: Any) -> None:
    """NCCL's buffers made during the capture (in the process, outside torch): no part is its source, so the rest
    holds exactly them. A part computed as what is left of the process figure would swallow them."""
    e = engine()
    e.worker.model_runner.during_capture.append(lambda: setattr(e.gpu, "other", e.gpu.other + 384 * MIB))
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), FINAL_BLOCKS)
    parts = exported_parts(e.beat())
    assert parts == books(e, unexplained=384 * MIB)
    assert_complete(parts, e.gpu.process_bytes)


def test_a_leak_shows_as_unexplained_even_inside_the_allocator_s_free_blocks(engine: Any) -> None:
    e = started(engine)
    e.gpu.allocate(GIB)
    parts = exported_parts(e.beat())
    assert parts["unexplained"] == GIB, "a live GiB no part names, though it sits in the allocator's free blocks"
    assert parts["activation_peak"] == GIB, "what is left of the free blocks for activations"
    e.gpu.allocate(2 * GIB)
    parts = exported_parts(e.beat())
    assert (parts["unexplained"], parts["activation_peak"]) == (3 * GIB, 0)
    assert_complete(parts, e.gpu.process_bytes)


def test_asleep_the_parts_follow_what_is_on_the_device(engine: Any) -> None:
    """vLLM 0.34's CuMem backend unmaps the weights, the runtime buffers and the graph pool, and the extensible KV
    cache releases its pages; torch's figures do not move. The parts drop to what stays, none below 0, the rest
    stays 0, the sleep level is exported; a wake-up of the weights alone brings them and the untagged-deferrable
    parts back, the KV cache last."""
    e = started(engine, sleep_mode=True)
    awake = exported(e.beat())
    assert awake["modelkv_engine_sleep_level"] == 0
    e.worker.sleep(level=1)
    asleep = exported(e.beat())
    assert asleep["modelkv_engine_sleep_level"] == 1
    parts = exported_parts(e.hook.publisher.snapshot)
    assert parts == books(e, runtime=e.gpu.context, weights=0, paged_kv=0, cuda_graphs=0, activation_peak=0)
    assert_complete(parts, e.gpu.process_bytes)
    e.worker.wake_up(tags=["weights"])
    partly = exported(e.beat())
    assert partly["modelkv_engine_sleep_level"] == 1, "the KV cache is still off the device"
    assert exported_parts(e.hook.publisher.snapshot) == books(e, paged_kv=0, activation_peak=0)
    e.worker.wake_up(tags=["kv_cache"])
    woke = exported(e.beat())
    assert woke["modelkv_engine_sleep_level"] == 0
    assert exported_parts(e.hook.publisher.snapshot) == books(e, activation_peak=0)


def test_without_the_sleep_allocator_s_books_a_sleeping_engine_would_keep_its_weights(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mechanism broken on purpose: the books not read (as before), the sleeping engine keeps its weights,
    runtime and graphs in the breakdown, and the rest goes negative by all of them."""
    monkeypatch.setattr("modelkv_exporter.engine.vllm_hook.lifecycle.released_bytes", lambda allocator: {})
    e = started(engine, sleep_mode=True)
    e.worker.sleep(level=1)
    parts = exported_parts(e.beat())
    assert parts["weights"] == e.worker.weights
    assert parts["unexplained"] == -(e.worker.weights + e.worker.runtime_buffers + e.worker.graph_pool)


def test_a_torch_allocated_kv_cache_and_an_eager_engine(engine: Any) -> None:
    e = engine(extensible=False)
    e.worker.vllm_config.model_config.enforce_eager = True
    size = CAPACITY * sum(STRIDES)
    config = SimpleNamespace(
        num_blocks=CAPACITY, segment_strides=STRIDES, kv_cache_tensors=[SimpleNamespace(size=size, layer_stride=1)]
    )
    run_engine_core(e.worker, config, FINAL_BLOCKS)
    parts = exported_parts(e.beat())
    assert parts["paged_kv"] == size and parts["cuda_graphs"] == 0, "eager: no graphs, a known 0"
    assert parts["unexplained"] == 0 and parts["runtime"] == e.gpu.context + e.worker.runtime_buffers
    assert_complete(parts, e.gpu.process_bytes)


def test_vllm_s_headroom_for_torch_is_read_and_is_the_activation_allowance_where_larger(engine: Any) -> None:
    """vLLM 0.34 keeps free for torch the larger of its profiled peak (with the graph estimate, 2.3 GiB) and torch's
    reserve growth over warm-up (3 GiB here): torch may hold 3 GiB of free blocks for activations."""
    e = started(engine, torch_reserve_growth=3 * GIB)
    e.gpu.allocate(3 * GIB)
    e.gpu.free(3 * GIB)
    figures = exported(e.beat())
    assert figures["modelkv_engine_torch_headroom_bytes"] == 3 * GIB
    assert figures["activation_peak"] == 3 * GIB and figures["unexplained"] == 0


def test_before_the_graphs_are_captured_that_part_and_the_rest_are_absent(engine: Any) -> None:
    e = engine()
    e.worker.init_device()
    e.worker.load_model()
    parts = exported_parts(e.beat())
    assert parts["weights"] == 4 * GIB and parts["runtime"] == e.gpu.context + e.worker.runtime_buffers
    assert "cuda_graphs" not in parts and "unexplained" not in parts, "unknown is absent, never 0"


def test_a_worker_hooked_after_its_device_started_has_no_runtime_and_no_rest(engine: Any) -> None:
    e = engine()
    e.worker.load_model()
    parts = exported_parts(e.beat())
    assert "runtime" not in parts and "unexplained" not in parts


def test_the_capture_wrapper_returns_what_vllm_returns_and_survives_failing_reads() -> None:
    class Runner:
        def capture_model(self, *, profile_only: bool = False) -> int:
            return 7

    pools = iter([PrivatePools(100, 100), PrivatePools(160, 110)])
    worker = SimpleNamespace(model_runner=Runner())
    seen: list[memory_parts.GraphPools] = []
    assert memory_parts.record_graph_capture(worker, seen.append, lambda: next(pools))
    assert not memory_parts.record_graph_capture(worker, seen.append, lambda: None), "wrapped once"
    assert worker.model_runner.capture_model(profile_only=True) == 7 and seen == [], "a measuring pass"
    assert worker.model_runner.capture_model() == 7
    assert seen == [memory_parts.GraphPools(60, 50)], "what the pools grew by (50 of it free), not what it returned"

    def fail(pools: memory_parts.GraphPools) -> None:
        raise RuntimeError("ours")

    def unknown() -> PrivatePools | None:
        raise RuntimeError("torch cannot say")

    other = SimpleNamespace(model_runner=Runner())
    memory_parts.record_graph_capture(other, fail, lambda: PrivatePools(5, 5))
    assert other.model_runner.capture_model() == 7
    blind = SimpleNamespace(model_runner=Runner())
    memory_parts.record_graph_capture(blind, seen.append, unknown)
    assert blind.model_runner.capture_model() == 7 and len(seen) == 1, "unknown pools: nothing recorded, never 0"


def test_the_graph_pools_free_blocks_are_no_activations(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the capture most of a graph pool is free blocks (the graphs' intermediate tensors, kept for the
    replays): torch counts them among its free blocks. Taken for activations (the mechanism broken on purpose),
    they are counted twice, in the graphs and in the activation part, and the rest goes 200 MiB negative."""
    e = started(engine)
    assert e.hook.publisher.snapshot.settings.cuda_graph_free_bytes == 200 * MIB
    assert exported_parts(e.beat()) == books(e)
    unaware = replace(e.hook.publisher.snapshot.settings, cuda_graph_free_bytes=0)
    monkeypatch.setattr(e.hook.publisher, "_snapshot", replace(e.hook.publisher.snapshot, settings=unaware))
    parts = exported_parts(e.beat())
    assert parts["activation_peak"] == e.worker.activation_peak + 200 * MIB and parts["unexplained"] == -200 * MIB


@pytest.mark.parametrize(("flag", "expected"), [("1", 2 * GIB), ("0", 2 * GIB + 320 * MIB), ("x", None)])
def test_the_graph_estimate_is_taken_out_only_where_vllm_added_it(
    flag: str, expected: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(memory_parts.ESTIMATE_FLAG, flag)
    worker = SimpleNamespace(peak_activation_memory=2 * GIB + 320 * MIB, cudagraph_memory_estimate=320 * MIB)
    assert memory_parts.activation_peak_bytes(worker) == expected


def test_the_breakdown_stacks_every_part_before_the_rest() -> None:
    assert breakdown_module.COMPONENT_NAMES == (
        "runtime",
        "weights",
        "paged_kv",
        "cuda_graphs",
        "activation_peak",
        "model_local_caches",
        "unexplained",
    )
