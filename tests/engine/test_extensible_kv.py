"""vLLM 0.34's extensible KV cache, through the real hook, on a stand-in worker driven in 0.34's method order.

The hook's wrappers, steps, sampler and publisher are the real ones; the worker, its cache and
the device are stand-ins built from vLLM 0.34.0's source (``tests/engine/extensible_stand_in.py``).
The growth check mirrors the rules' leak signal (``modelkv_engine:unplanned_growth_bytes`` and
``ModelKVUndeclaredMemoryGrowth``'s 256 MiB) on the figures the snapshot carries.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.engine.config import HookConfig
from modelkv_exporter.engine.observe import installed
from modelkv_exporter.engine.samplers import CudaSampler
from modelkv_exporter.engine.vllm_hook import lifecycle, sleep
from modelkv_exporter.engine.vllm_hook import plugin as vllm_plugin
from modelkv_exporter.engine.vllm_hook.extensible_kv import SOURCE, WithExtensibleKV, committed_reader, figures_of
from tests.engine.extensible_stand_in import (
    GIB,
    GRANULE,
    MIB,
    Gpu,
    SleepAllocator,
    StandInKVCache,
    StandInWorker,
    kv_cache_config,
    run_engine_core,
)

PAGE_AT = 256 * MIB
"""ModelKVUndeclaredMemoryGrowth's threshold."""
STRIDES = [64 * 1024 + 512, 64 * 1024 + 512]
"""Two layer segments whose block stride is no multiple of a granule, so rounding shows."""
CAPACITY = 400_000


def unplanned_growth(snapshot: Snapshot) -> int:
    """``modelkv_engine:unplanned_growth_bytes`` on one snapshot: the high water of live tensors beyond its baseline
    (live tensors plus the profiled activation peak) plus non-torch growth."""
    current, baseline = snapshot.measured.current, snapshot.measured.baseline
    assert current is not None and baseline is not None
    now, base = current.values, baseline.values
    live = now["torch_allocated_high_water"] - base["torch_allocated_high_water"]
    non_torch = (now["process_gpu"] - base["process_gpu"]) - (now["torch_reserved"] - base["torch_reserved"])
    return max(live, 0) + max(non_torch, 0)


def assert_no_page(snapshot: Snapshot) -> None:
    growth = unplanned_growth(snapshot)
    assert growth <= PAGE_AT, f"undeclared growth {growth / GIB:.2f} GiB would page"


class Engine:
    """A hooked stand-in worker on its own device, with the hook's heartbeat driven by hand."""

    def __init__(
        self,
        spool: Path,
        monkeypatch: pytest.MonkeyPatch,
        worker_class: type[StandInWorker] = StandInWorker,
        **worker: Any,
    ) -> None:
        self.gpu = Gpu()
        monkeypatch.setattr(
            lifecycle, "sampler_for", lambda device: CudaSampler(self.gpu, "cuda:0", nvml=self.gpu, nvml_device=0)
        )
        monkeypatch.setitem(sys.modules, sleep.ALLOCATOR_MODULE, SimpleNamespace(CuMemAllocator=SleepAllocator))
        cls = type("Worker", (worker_class,), {})
        vllm_plugin.Registration(HookConfig(spool, sample_interval=3600)).patch_worker(SimpleNamespace(Worker=cls))  # type: ignore[arg-type]
        self.worker = cls(self.gpu, **worker)

    @property
    def hook(self) -> lifecycle.WorkerHook:
        hook: lifecycle.WorkerHook = getattr(self.worker, lifecycle.ATTRIBUTE)
        return hook

    @property
    def cache(self) -> StandInKVCache:
        cache: StandInKVCache = self.worker.model_runner.extensible_kv_cache
        return cache

    def beat(self) -> Snapshot:
        """One heartbeat, as the hook's thread takes it."""
        self.hook.publisher.beat(self.hook.sampler())
        return self.hook.publisher.snapshot

    def close(self) -> None:
        self.worker.shutdown()


def engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **defaults: Any) -> Iterator[Callable[..., Engine]]:
    """A fixture's body: makes stand-in engines (``defaults`` under each call's own settings), then closes them
    and removes the observer their hook installed (a later test's fixture would find it left)."""
    made: list[Engine] = []

    def make(**worker: Any) -> Engine:
        made.append(Engine(tmp_path, monkeypatch, **{**defaults, **worker}))
        return made[-1]

    yield make
    for one in made:
        one.close()
    left = installed()
    if left is not None:
        left.uninstall()


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Engine]]:
    yield from engines(tmp_path, monkeypatch)


def test_the_final_commit_is_exported_exactly_and_the_baseline_follows_it(engine: Any) -> None:
    e = engine()
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), final_blocks=250_000)
    assert e.worker.calls == [
        "init_device",
        "load_model",
        "determine_available_memory",
        "initialize_from_config",
        "compile_or_warm_up_model",
        "extend_kv_cache",
    ]
    snapshot = e.beat()
    committed = e.cache.physical_bytes
    assert committed == e.cache.physical_bytes_for(250_000) == 2 * -(-250_000 * STRIDES[0] // GRANULE) * GRANULE
    settings = snapshot.settings
    assert (settings.paged_kv_bytes, settings.paged_kv_blocks) == (committed, 250_000)
    assert (settings.paged_kv_reserved_bytes, settings.paged_kv_reserved_blocks) == (CAPACITY * sum(STRIDES), CAPACITY)
    baseline = snapshot.measured.baseline
    assert baseline is not None and baseline.values[SOURCE] == committed
    assert baseline.values["process_gpu"] == e.gpu.process_bytes, "the baseline was taken after the final commit"
    assert snapshot.measured.current is not None and snapshot.measured.current.values[SOURCE] == committed
    assert_no_page(snapshot)
    assert e.hook.sampler.inner.resetting, "the sampler resets torch's peak from the final commit on"  # type: ignore[attr-defined]


def test_before_the_final_commit_only_what_is_committed_counts_and_no_baseline_is_moved_early(engine: Any) -> None:
    e = engine()
    e.worker.load_model()
    e.worker.determine_available_memory()
    e.worker.initialize_from_config(kv_cache_config(CAPACITY, STRIDES))
    reserved = e.hook.publisher.snapshot.settings
    assert (reserved.paged_kv_bytes, reserved.paged_kv_blocks) == (e.cache.physical_bytes, 1), "the null block only"
    assert reserved.paged_kv_bytes is not None and reserved.paged_kv_bytes < 2 * GRANULE + 1
    assert reserved.paged_kv_reserved_blocks == CAPACITY
    e.worker.compile_or_warm_up_model()
    before_extend = e.hook.publisher.snapshot.measured.baseline
    assert before_extend is not None and not e.hook.sampler.inner.resetting  # type: ignore[attr-defined]
    e.worker.extend_kv_cache(250_000)
    after = e.hook.publisher.snapshot.measured.baseline
    assert (
        after is not None
        and after.values["process_gpu"] - before_extend.values["process_gpu"]
        == e.cache.physical_bytes - GRANULE * 2 + e.worker.graph_pool
    ), "the final commit and the graph pools, captured in their own pool since the baseline before warm-up"


def test_a_shrink_below_what_warm_up_committed_is_exported_as_the_final_size(engine: Any) -> None:
    e = engine(warm_up_blocks=300_000)
    e.worker.load_model()
    e.worker.determine_available_memory()
    e.worker.initialize_from_config(kv_cache_config(CAPACITY, STRIDES))
    e.cache.commit(300_000)
    e.worker.extend_kv_cache(120_000)
    snapshot = e.beat()
    assert e.cache.num_committed_blocks == 120_000
    assert snapshot.settings.paged_kv_bytes == e.cache.physical_bytes == e.cache.physical_bytes_for(120_000)
    assert snapshot.measured.current is not None and snapshot.measured.current.values[SOURCE] == e.cache.physical_bytes
    assert_no_page(snapshot)


def test_sleep_and_wake_release_and_recommit_without_a_page(engine: Any) -> None:
    e = engine()
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), final_blocks=250_000)
    committed = e.cache.physical_bytes
    e.worker.sleep(level=1)
    asleep = e.beat()
    assert asleep.measured.current is not None and asleep.measured.current.values[SOURCE] == 0
    assert asleep.settings.paged_kv_blocks == 250_000, "the blocks to recommit are kept"
    assert_no_page(asleep)
    e.worker.wake_up()
    awake = e.beat()
    assert awake.measured.current is not None and awake.measured.current.values[SOURCE] == committed
    assert unplanned_growth(awake) == 0


def test_a_real_leak_after_the_final_commit_still_pages(engine: Any) -> None:
    e = engine()
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), final_blocks=250_000)
    e.gpu.allocate(e.worker.activation_peak + GIB)
    with pytest.raises(AssertionError, match="would page"):
        assert_no_page(e.beat())


def test_breaking_the_baseline_move_makes_the_start_up_page(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook as it was for vLLM 0.30-0.33: baseline at warm-up, no extend step. The final commit then pages."""
    monkeypatch.setattr(lifecycle, "after_extend", lambda worker, config: None)
    monkeypatch.setattr(lifecycle, "figures_of", lambda cache: None)
    e = engine()
    run_engine_core(e.worker, kv_cache_config(CAPACITY, STRIDES), final_blocks=250_000)
    with pytest.raises(AssertionError, match="would page"):
        assert_no_page(e.beat())


def test_a_worker_without_an_extensible_cache_behaves_as_before(engine: Any) -> None:
    e = engine(extensible=False)
    config = kv_cache_config(1000, STRIDES)
    config.kv_cache_tensors = [SimpleNamespace(size=1000 * sum(STRIDES))]
    run_engine_core(e.worker, config, final_blocks=0)
    assert "extend_kv_cache" not in e.worker.calls
    snapshot = e.beat()
    settings = snapshot.settings
    assert (settings.paged_kv_bytes, settings.paged_kv_blocks) == (1000 * sum(STRIDES), 1000)
    assert settings.paged_kv_reserved_bytes is None and settings.paged_kv_reserved_blocks is None
    assert snapshot.measured.current is not None and SOURCE not in snapshot.measured.current.values
    assert_no_page(snapshot)


def test_the_reader_holds_the_worker_weakly_and_never_raises() -> None:
    gpu = Gpu()
    worker = StandInWorker(gpu)
    worker.model_runner.extensible_kv_cache = StandInKVCache(gpu, 10, [GRANULE])
    worker.model_runner.extensible_kv_cache.commit(3)
    read = committed_reader(worker)
    assert read() == 3 * GRANULE
    gone = weakref.ref(worker)
    del worker
    gc.collect()
    assert gone() is None and read() is None

    class Raising:
        @property
        def physical_bytes(self) -> int:
            raise RuntimeError("driver gone")

    assert figures_of(Raising()) is None
    assert figures_of(SimpleNamespace(physical_bytes=1, num_committed_blocks=True, size=1, capacity_blocks=1)) is None

    def failing() -> int:
        raise RuntimeError("boom")

    sampler = WithExtensibleKV(CudaSampler(Gpu(), "cuda:0"), failing)
    assert SOURCE not in sampler().values
