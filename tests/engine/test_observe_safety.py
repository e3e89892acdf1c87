"""Observation is honest when it cannot see (absent, never 0), harmless when it fails, and gone when turned off."""

from __future__ import annotations

import copy
import gc
import logging
import threading
from typing import Any

import pytest
import torch
from transformers import DynamicCache, StaticCache, cache_utils

from modelkv_exporter.engine.engine_log import flush
from modelkv_exporter.engine.observe import Observer, hooks, install, installed, transformers_check
from modelkv_exporter.engine.observe import tally as tally_module
from modelkv_exporter.engine.observe.layers import HOOKED_METHODS
from modelkv_exporter.engine.observe.observer import NO_CALL, OFF
from tests.engine.observing import Owner, add, figures, full_config, kv, storage_bytes


def test_absent_before_any_call(observer: Observer) -> None:
    owner = Owner()
    add(observer, owner)
    f = figures(observer, owner)
    assert not f.available and f.reason == NO_CALL
    assert f.peak_bytes is f.recent_peak_bytes is f.live_bytes is f.cache_calls is None


def test_a_layer_class_holding_tensors_beside_its_keys_and_values_is_weighed_by_all_of_them(
    observer: Observer,
) -> None:
    """Issue 47: a subclass keeping another tensor (scales, a buffer) was absent ("not understood"); it is weighed by
    every tensor it holds, and a plain subclass as before."""

    class ExtraTensorLayer(cache_utils.DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.side = torch.zeros(4, 4)
            return super().update(key_states, value_states, *args, **kwargs)

    class PlainSubclass(cache_utils.DynamicLayer):
        pass

    bad, good = Owner(), Owner()
    add(observer, bad, good)

    def run_with(layer_class: type) -> Any:
        def run(self: Owner) -> None:
            cache = cache_utils.Cache(layers=[layer_class()])
            cache.update(kv(1, 2), kv(1, 2), 0)
            self.kept["c"] = cache

        return run

    bad(run_with(ExtraTensorLayer))
    good(run_with(PlainSubclass))
    f_bad, f_good = figures(observer, bad), figures(observer, good)
    side = bad.kept["c"].layers[0].side
    assert f_bad.available and f_bad.live_bytes == storage_bytes(bad.kept["c"]) + side.untyped_storage().nbytes()
    assert f_good.available and f_good.live_bytes == storage_bytes(good.kept["c"])


def test_quantized_layers_are_absent(observer: Observer) -> None:
    class Quantized(cache_utils.QuantizedLayer):
        def _quantize(self, tensor, axis):  # type: ignore[no-untyped-def]
            return tensor.clone()

        def _dequantize(self, q):  # type: ignore[no-untyped-def]
            return q

    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = cache_utils.Cache(layers=[Quantized()])
        cache.update(kv(1, 2), kv(1, 2), 0)
        self.kept["c"] = cache

    owner(run)
    f = figures(observer, owner)
    assert not f.available and f.live_bytes is None and "quantized" in (f.reason or "")


def test_tensors_on_several_devices_are_absent(observer: Observer) -> None:
    """What an offloading cache looks like at a sample; the meta device stands in for the second device."""
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = DynamicCache()
        for layer in range(2):
            cache.update(kv(1, 2), kv(1, 2), layer)
        cache.layers[1].keys = cache.layers[1].keys.to("meta")
        cache.layers[1].values = cache.layers[1].values.to("meta")
        self.kept["c"] = cache

    owner(run)
    f = figures(observer, owner)
    assert not f.available and f.live_bytes is None and "several devices" in (f.reason or "")


def test_a_cuda_graph_replay_inside_the_owner_makes_it_absent(observer: Observer) -> None:
    for name in ("capture_begin", "capture_end", "replay"):
        assert hasattr(vars(torch.cuda.CUDAGraph)[name], "__modelkv_original__")
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:  # what a replaying owner looks like from Python (no GPU here)
        DynamicCache().update(kv(1, 2), kv(1, 2), 0)
        hooks.on_replay()

    owner(run)
    f = figures(observer, owner)
    assert not f.available and f.live_bytes is None and "CUDA graph" in (f.reason or "")
    assert f.calls == 1, "calls are still counted"


def test_a_capture_while_the_owner_runs_makes_it_absent(observer: Observer) -> None:
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        hooks.on_capture_begin()
        try:
            DynamicCache().update(kv(1, 2), kv(1, 2), 0)
        finally:
            hooks.on_capture_end()

    owner(run)
    assert "CUDA graph" in (figures(observer, owner).reason or "")


def test_a_failure_inside_observation_is_logged_once_and_never_reaches_the_model(
    observer: Observer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    owner = Owner()
    add(observer, owner)

    def explode(cls: type) -> object:
        raise RuntimeError("reader exploded")

    monkeypatch.setattr(hooks, "plan_for", explode)
    x = kv(2, 3)
    expected, _ = DynamicCache().update(x, x, 0)

    def run(self: Owner) -> torch.Tensor:
        keys, _ = DynamicCache().update(x, x, 0)
        return keys

    with caplog.at_level(logging.WARNING, logger="vllm.modelkv_exporter.observe"):
        results = [owner(run) for _ in range(4)]
        assert not [r for r in caplog.records if "observation failed" in r.getMessage()], "never inline"
        flush()
    assert all(torch.equal(r, expected) for r in results)
    assert len([r for r in caplog.records if "observation failed" in r.getMessage()]) == 1
    f = figures(observer, owner)
    assert not f.available and f.live_bytes is None and "reader exploded" in (f.reason or "")


def test_a_failure_at_owner_entry_never_reaches_the_model(observer: Observer, monkeypatch: pytest.MonkeyPatch) -> None:
    owner = Owner()
    add(observer, owner)

    def explode(state: object) -> None:
        raise ValueError("entry exploded")

    monkeypatch.setattr(hooks, "enter", explode)
    assert owner(lambda self: 42) == 42
    assert owner.side_entry(lambda self: 7) == 7
    assert "entry exploded" in (figures(observer, owner).reason or "")


def test_a_failing_sample_is_absent_not_raised(observer: Observer, monkeypatch: pytest.MonkeyPatch) -> None:
    owner = Owner()
    add(observer, owner)
    owner(lambda self: DynamicCache().update(kv(1, 1), kv(1, 1), 0))

    def explode(*args: object) -> None:
        raise OSError("cannot read")

    monkeypatch.setattr(observer, "_recount", explode)
    (f,) = observer.sample()
    assert not f.available and "cannot read" in (f.reason or "") and f.peak_bytes is None


def test_the_models_own_exception_passes_through_unchanged(observer: Observer) -> None:
    owner = Owner()
    add(observer, owner)

    class ModelError(Exception):
        pass

    def run(self: Owner) -> None:
        raise ModelError("from the model")

    with pytest.raises(ModelError, match="from the model"):
        owner(run)
    assert hooks.running.get() is None


def hook_sites() -> dict[tuple[object, str], object]:
    """Every attribute the observer may replace, as it is now."""
    classes = []
    stack = [cache_utils.CacheLayerMixin]
    while stack:
        cls = stack.pop()
        classes.append(cls)
        stack.extend(cls.__subclasses__())
    sites: dict[tuple[object, str], object] = {(c, n): c.__dict__.get(n) for c in classes for n in HOOKED_METHODS}
    for name in ("__init__", "__setstate__", "__init_subclass__"):
        sites[(cache_utils.CacheLayerMixin, name)] = cache_utils.CacheLayerMixin.__dict__.get(name)
    for name in ("capture_begin", "capture_end", "replay"):
        sites[(torch.cuda.CUDAGraph, name)] = vars(torch.cuda.CUDAGraph)[name]
    return sites


def test_a_layer_method_called_with_self_as_a_keyword_is_observed(observer: Observer) -> None:
    """The layer wrapper forwards its arguments whole; ``self`` passed by name is still the layer it measures."""
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = DynamicCache()
        cache.update(kv(1, 2), kv(1, 2), 0)
        layer = cache.layers[0]
        type(layer).update(self=layer, key_states=kv(1, 1), value_states=kv(1, 1))
        self.kept["cache"] = cache

    owner(run)
    observer.sample()
    f = figures(observer, owner)
    assert f.available, f.reason
    assert f.live_bytes == 2 * kv(1, 3).nbytes


@pytest.mark.parametrize("value", ["0", "off", "false", "no"])
def test_modelkv_observe_0_installs_nothing_and_reports_every_owner_absent(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = hook_sites()
    owner = Owner()
    monkeypatch.setenv("MODELKV_OBSERVE", value)
    observer = install([("o", owner)])
    assert not observer.enabled and installed() is None
    assert hook_sites() == before, "no class was touched"
    assert not any(hasattr(wrapper, hooks.ENTRY) for wrapper in owner_sites().values())
    owner(lambda self: DynamicCache().update(kv(1, 1), kv(1, 1), 0))
    (f,) = observer.sample()
    assert not f.available and f.reason == OFF and f.peak_bytes is None and f.calls is None
    assert not hooks.records


def test_an_unreadable_switch_keeps_observation_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELKV_OBSERVE", "maybe")
    observer = install([])
    try:
        assert observer.enabled and observer.attached and observer.installation is installed()
    finally:
        observer.uninstall()


def owner_sites() -> dict[str, object]:
    return {name: vars(Owner).get(name) for name in ("forward", "side_entry", "_inner")}


def test_uninstall_restores_every_class_and_owner() -> None:
    before, owners_before = hook_sites(), owner_sites()
    owner = Owner()
    observer = install([("o", owner)], enabled=True)
    assert hook_sites() != before and owner_sites() != owners_before
    assert all(hasattr(wrapper, hooks.ENTRY) for wrapper in owner_sites().values())
    assert "forward" not in owner.__dict__, "the owner object itself is never changed"
    observer.uninstall()
    assert hook_sites() == before and owner_sites() == owners_before and installed() is None
    assert not hooks.owners
    DynamicCache().update(kv(1, 1), kv(1, 1), 0)
    static = StaticCache(config=full_config(), max_cache_len=4)
    static.update(kv(1, 1), kv(1, 1), 0)
    assert storage_bytes(copy.deepcopy(static)) == storage_bytes(static)


def test_a_transformers_that_fails_the_probe_is_not_hooked_and_every_figure_is_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = hook_sites()
    monkeypatch.setattr(transformers_check, "names", lambda: (None, "CacheLayerMixin has no update()"))
    owner = Owner()
    observer = install([("o", owner)], enabled=True)
    try:
        assert "unknown way" in (observer.unavailable or "")
        assert hook_sites() == before and not any(hasattr(w, hooks.ENTRY) for w in owner_sites().values())
        owner(lambda self: DynamicCache().update(kv(1, 1), kv(1, 1), 0))
        (f,) = observer.sample()
        assert not f.available and f.live_bytes is None and "unknown way" in (f.reason or "")
    finally:
        observer.uninstall()


def test_a_self_test_that_disagrees_removes_the_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe is a real check: break the weighing and the observer refuses to report."""
    before = hook_sites()
    monkeypatch.setattr(hooks, "pair_bytes", lambda keys, values: 1)
    observer = install([("o", Owner())], enabled=True)
    try:
        assert "where the caches held" in (observer.unavailable or "")
        assert hook_sites() == before
    finally:
        observer.uninstall()


def test_torch_compile_traces_through_the_hooks(observer: Observer) -> None:
    """Under dynamo the wrappers are transparent: fullgraph compiles, the compiled update writes."""
    owner = Owner()
    add(observer, owner)
    cache = StaticCache(config=full_config(1), max_cache_len=8)
    x = kv(1, 1)
    cache.update(x, x, 0, {"cache_position": torch.arange(1)})

    def step(k: torch.Tensor) -> torch.Tensor:
        keys, _ = cache.update(k, k, 0, {"cache_position": torch.tensor([1])})
        return keys.sum()

    compiled = torch.compile(lambda k: owner.side_entry(lambda self: step(k)), backend="eager", fullgraph=True)
    assert torch.allclose(compiled(x), cache.layers[0].keys.sum())
    assert int(cache.get_seq_length()) == 2


def test_owners_are_held_weakly_and_dropped_with_their_model(observer: Observer) -> None:
    owner, kept = Owner(), Owner()
    add(observer, owner, kept)
    owner(lambda self: DynamicCache().update(kv(1, 1), kv(1, 1), 0))
    del owner
    gc.collect()
    assert [f.owner for f in observer.sample()] == [str(id(kept))]


class NoLock:
    """A lock that does not lock: the mechanism broken on purpose."""

    def acquire(self, *args: object) -> bool:
        return True

    def release(self) -> None:
        pass

    def __enter__(self) -> NoLock:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.mark.parametrize("locked", [True, False], ids=["locked", "lock-broken"])
def test_a_sample_on_the_heartbeat_thread_never_corrupts_the_counts(
    observer: Observer, monkeypatch: pytest.MonkeyPatch, locked: bool
) -> None:
    """The heartbeat samples while the model updates: the model's update lands inside a sample's recount, and
    does not wait for it. Its change waits in ``hooks.changes`` until the sample lets go of ``hooks.lock``.

    Broken on purpose (the model applies its change itself, the lock locking nothing), the sample writes back the
    bytes it read before the update, the owner's live total loses the update, and the next transient peak is
    under-reported.
    """
    if not locked:
        monkeypatch.setattr(hooks, "lock", NoLock())
        monkeypatch.setattr(hooks, "BACKLOG", -1)
    owner = Owner()
    add(observer, owner)
    cache = DynamicCache()
    owner(lambda self: cache.update(kv(1, 4), kv(1, 4), 0))
    read, resume = threading.Event(), threading.Event()
    real_storages = tally_module.storages

    def pausing_storages(layer: object, *args: Any) -> Any:
        found = real_storages(layer, *args)
        if threading.current_thread().name == "sampler" and not read.is_set():
            read.set()
            resume.wait(10)
        return found

    monkeypatch.setattr(tally_module, "storages", pausing_storages)
    sampler = threading.Thread(target=observer.sample, name="sampler")
    model = threading.Thread(target=lambda: owner(lambda self: cache.update(kv(1, 4), kv(1, 4), 0)), name="model")
    sampler.start()
    assert read.wait(10)
    model.start()
    model.join(timeout=10)
    assert not model.is_alive(), "the update never waits for the sample"
    resume.set()
    sampler.join(10)
    model.join(10)

    def transient(self: Owner) -> None:
        DynamicCache().update(kv(1, 16), kv(1, 16), 0)

    owner(transient)
    f = figures(observer, owner)
    per_position = 2 * kv(1, 1).nbytes
    assert f.live_bytes == storage_bytes(cache) == 8 * per_position
    if locked:
        assert f.recent_peak_bytes == f.peak_bytes == (8 + 16) * per_position
    else:
        assert (f.recent_peak_bytes or 0) < (8 + 16) * per_position, "the broken mechanism under-reports"
