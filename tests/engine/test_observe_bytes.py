"""Observed bytes equal the real cache tensors' storages, per cache type, batch size and dtype; and who they belong to.

Each expected figure is computed twice, independently of the observer: from the geometry, and by
summing the distinct storages behind the caches the test kept.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from transformers import DynamicCache, EncoderDecoderCache, Qwen2Config, Qwen2Model, StaticCache, cache_utils

from modelkv_exporter.engine.observe import Observer
from modelkv_exporter.engine.observe.layers import OPAQUE_LAYERS, VETTED_KV_ATTRIBUTES, plan_for
from tests.engine.observing import (
    HEAD_DIM,
    HEADS,
    LAYERS,
    Owner,
    add,
    figures,
    full_config,
    kv,
    sliding_config,
    storage_bytes,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BATCHES = [1, 3, 8]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", BATCHES)
def test_dynamic_cache(observer: Observer, batch: int, dtype: torch.dtype) -> None:
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = DynamicCache()
        for layer in range(LAYERS):
            cache.update(kv(batch, 5, dtype), kv(batch, 5, dtype), layer)
        for _ in range(3):
            for layer in range(LAYERS):
                cache.update(kv(batch, 1, dtype), kv(batch, 1, dtype), layer)
        self.kept["c"] = cache

    owner(run)
    f = figures(observer, owner)
    expected = 2 * LAYERS * batch * HEADS * 8 * HEAD_DIM * dtype.itemsize
    assert f.available and f.live_bytes == expected == storage_bytes(owner.kept["c"])
    assert f.peak_bytes == expected and f.calls == 1 and f.cache_calls == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", BATCHES)
def test_sliding_window_layers_are_weighed_by_their_storage_not_their_view(
    observer: Observer, batch: int, dtype: torch.dtype
) -> None:
    window = 6
    owner = Owner()
    add(observer, owner)

    def prefill(self: Owner) -> None:
        cache = DynamicCache(config=sliding_config(window))
        for layer in range(LAYERS):
            cache.update(kv(batch, 10, dtype), kv(batch, 10, dtype), layer)
        self.kept["c"] = cache

    owner(prefill)
    cache = owner.kept["c"]
    assert all(type(layer).__name__ == "DynamicSlidingWindowLayer" for layer in cache.layers)
    per_position = batch * HEADS * HEAD_DIM * dtype.itemsize
    view_bytes = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert view_bytes == 2 * LAYERS * (window - 1) * per_position, "the view is window - 1 positions"
    f = figures(observer, owner)
    assert f.live_bytes == storage_bytes(cache) == 2 * LAYERS * 10 * per_position, "the whole prefill stays allocated"

    def step(self: Owner) -> None:
        for layer in range(LAYERS):
            self.kept["c"].update(kv(batch, 1, dtype), kv(batch, 1, dtype), layer)

    owner(step)
    f = figures(observer, owner)
    assert f.live_bytes == storage_bytes(cache) == 2 * LAYERS * window * per_position, "steady decode: window"
    assert f.peak_bytes == f.recent_peak_bytes == 2 * LAYERS * 10 * per_position
    owner(step)
    f = figures(observer, owner)
    assert f.recent_peak_bytes == f.live_bytes == 2 * LAYERS * window * per_position


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", BATCHES)
def test_static_cache_holds_its_full_extent_from_the_first_write(
    observer: Observer, batch: int, dtype: torch.dtype
) -> None:
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = StaticCache(config=full_config(), max_cache_len=16)
        for layer in range(LAYERS):
            cache.update(kv(batch, 2, dtype), kv(batch, 2, dtype), layer, {"cache_position": torch.arange(2)})
        self.kept["c"] = cache

    owner(run)
    expected = 2 * LAYERS * batch * HEADS * 16 * HEAD_DIM * dtype.itemsize
    assert figures(observer, owner).live_bytes == expected == storage_bytes(owner.kept["c"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", BATCHES)
def test_static_cache_with_sliding_layers(observer: Observer, batch: int, dtype: torch.dtype) -> None:
    window = 4
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = StaticCache(config=sliding_config(window), max_cache_len=16)
        for position in range(6):
            for layer in range(LAYERS):
                cache.update(
                    kv(batch, 1, dtype), kv(batch, 1, dtype), layer, {"cache_position": torch.tensor([position])}
                )
        self.kept["c"] = cache

    owner(run)
    cache = owner.kept["c"]
    assert all(type(layer).__name__ in ("StaticSlidingWindowLayer", "SlidingWindowLayer") for layer in cache.layers)
    expected = 2 * LAYERS * batch * HEADS * window * HEAD_DIM * dtype.itemsize
    assert figures(observer, owner).live_bytes == expected == storage_bytes(cache)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", BATCHES)
def test_encoder_decoder_cache_self_and_cross_attention(observer: Observer, batch: int, dtype: torch.dtype) -> None:
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        for layer in range(LAYERS):
            cache.self_attention_cache.update(kv(batch, 7, dtype), kv(batch, 7, dtype), layer)
            cache.cross_attention_cache.update(kv(batch, 30, dtype), kv(batch, 30, dtype), layer)
        self.kept["c"] = cache

    owner(run)
    per_position = batch * HEADS * HEAD_DIM * dtype.itemsize
    assert figures(observer, owner).live_bytes == storage_bytes(owner.kept["c"]) == 2 * LAYERS * 37 * per_position


def test_static_layer_is_weighed_again_when_its_tensors_are_replaced(observer: Observer) -> None:
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = StaticCache(config=full_config(1), max_cache_len=16)
        cache.update(kv(1, 1), kv(1, 1), 0, {"cache_position": torch.arange(1)})
        self.kept["c"] = cache

    owner(run)
    assert figures(observer, owner).live_bytes == storage_bytes(owner.kept["c"])
    owner.kept["c"].layers[0].keys = torch.zeros(1, HEADS, 32, HEAD_DIM)
    owner(lambda self: self.kept["c"].update(kv(1, 1), kv(1, 1), 0))
    f = figures(observer, owner)
    assert f.live_bytes == storage_bytes(owner.kept["c"]) == (32 + 16) * HEADS * HEAD_DIM * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 4])
def test_a_real_models_attention_layers_fill_the_caches(observer: Observer, batch: int, dtype: torch.dtype) -> None:
    config = Qwen2Config(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=64,
        intermediate_size=64,
        vocab_size=50,
    )
    model = Qwen2Model(config).to(dtype).eval()

    class LanguageModel(Owner):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

    owner = LanguageModel()
    add(observer, owner)

    def run(self: Owner) -> None:
        with torch.no_grad():
            static, dynamic = StaticCache(config=config, max_cache_len=32), DynamicCache(config=config)
            ids = torch.randint(0, 50, (batch, 6))
            for cache in (static, dynamic):
                self.model(input_ids=ids, past_key_values=cache, use_cache=True)
                for step in range(3):
                    position = torch.tensor([6 + step])
                    self.model(input_ids=ids[:, :1], past_key_values=cache, use_cache=True, cache_position=position)
        self.kept["c"] = (static, dynamic)

    owner(run)
    per_position = batch * 2 * 16 * dtype.itemsize
    assert figures(observer, owner).live_bytes == storage_bytes(*owner.kept["c"]) == 2 * 2 * per_position * (32 + 9)


def test_a_per_call_cache_freed_before_the_sample_is_still_seen(observer: Observer) -> None:
    owner = Owner()
    add(observer, owner)
    expected = 2 * LAYERS * 2 * HEADS * 16 * HEAD_DIM * 4

    def run(self: Owner) -> None:
        cache = StaticCache(config=full_config(), max_cache_len=16)
        for layer in range(LAYERS):
            cache.update(kv(2, 1), kv(2, 1), layer, {"cache_position": torch.arange(1)})

    owner(run)
    f = figures(observer, owner)
    assert f.live_bytes == 0 and f.recent_peak_bytes == expected and f.peak_bytes == expected
    f = figures(observer, owner)
    assert f.recent_peak_bytes == 0 and f.peak_bytes == expected, "the next interval saw nothing"


def test_calls_count_every_entry_and_cache_calls_those_that_used_a_cache(observer: Observer) -> None:
    owner = Owner()
    add(observer, owner)

    def with_cache(self: Owner) -> None:
        DynamicCache().update(kv(1, 2), kv(1, 2), 0)

    for run in (with_cache, lambda self: None, with_cache, lambda self: None):
        owner(run)
    owner.side_entry(with_cache)
    f = figures(observer, owner)
    assert f.calls == 5 and f.cache_calls == 3
    assert f.recent_peak_bytes == 2 * 2 * HEADS * HEAD_DIM * 4


def test_a_retained_cache_counts_until_released(observer: Observer) -> None:
    owner = Owner()
    add(observer, owner)

    def create(self: Owner) -> None:
        cache = DynamicCache()
        cache.update(kv(2, 4), kv(2, 4), 0)
        self.kept["request"] = cache

    owner(create)
    size = storage_bytes(owner.kept["request"])
    assert figures(observer, owner).live_bytes == size
    owner.kept.pop("request")
    f = figures(observer, owner)
    assert f.live_bytes == 0 and f.recent_peak_bytes == size


def test_deep_copies_never_updated_are_weighed(observer: Observer) -> None:
    """Qwen3-TTS's batched path: per-request deep copies, and a batched copy freed inside the call."""
    owner = Owner()
    add(observer, owner)
    window, rows = 6, 3
    base = DynamicCache(config=sliding_config(window))
    for layer in range(LAYERS):
        base.update(kv(rows, window), kv(rows, window), layer)

    def run(self: Owner) -> None:
        requests = [copy.deepcopy(base) for _ in range(rows)]
        batched = copy.deepcopy(requests[0])
        for target, sources in zip(batched.layers, zip(*(r.layers for r in requests), strict=True), strict=True):
            target.keys = torch.cat([s.keys for s in sources], dim=0)
            target.values = torch.cat([s.values for s in sources], dim=0)
        working = copy.deepcopy(batched)
        for layer in range(LAYERS):
            working.update(kv(rows * rows, 2), kv(rows * rows, 2), layer)
        self.kept["requests"] = requests
        self.kept["peak"] = storage_bytes(*requests, batched, working)

    owner(run)
    f = figures(observer, owner)
    assert f.live_bytes == storage_bytes(*owner.kept["requests"])
    assert f.recent_peak_bytes == owner.kept["peak"] and f.cache_calls == 1


def test_nested_owners_keep_their_own_caches(observer: Observer) -> None:
    outer, inner = Owner(), Owner()
    add(observer, outer, inner)

    def inner_run(self: Owner) -> None:
        cache = DynamicCache()
        cache.update(kv(1, 3), kv(1, 3), 0)
        self.kept["c"] = cache

    def outer_run(self: Owner) -> None:
        inner(inner_run)
        cache = DynamicCache()
        cache.update(kv(1, 9), kv(1, 9), 0)
        self.kept["c"] = cache

    outer(outer_run)
    assert figures(observer, inner).live_bytes == storage_bytes(inner.kept["c"])
    assert figures(observer, outer).live_bytes == storage_bytes(outer.kept["c"])


def test_a_cache_made_outside_belongs_to_the_owner_that_uses_it(observer: Observer) -> None:
    owner = Owner()
    add(observer, owner)
    cache = DynamicCache()
    owner(lambda self: cache.update(kv(2, 3), kv(2, 3), 0))
    assert figures(observer, owner).live_bytes == storage_bytes(cache)


def test_copies_and_pickles_are_what_they_are_without_the_observer(observer: Observer) -> None:
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = DynamicCache(config=sliding_config(4))
        for layer in range(LAYERS):
            cache.update(kv(2, 6), kv(2, 6), layer)
        self.kept["copies"] = [copy.deepcopy(cache), pickle.loads(pickle.dumps(cache)), cache]

    owner(run)
    deep, pickled, cache = owner.kept["copies"]
    for other in (deep, pickled):
        for a, b in zip(cache.layers, other.layers, strict=True):
            assert type(a) is type(b) and torch.equal(a.keys, b.keys) and a.cumulative_length == b.cumulative_length
    assert figures(observer, owner).live_bytes == storage_bytes(deep, pickled, cache)


def test_layer_classes_defined_after_install_are_hooked(observer: Observer) -> None:
    class LateLayer(cache_utils.DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):  # type: ignore[no-untyped-def]
            return super().update(key_states, value_states, *args, **kwargs)

    assert hasattr(vars(LateLayer)["update"], "__modelkv_original__")
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = cache_utils.Cache(layers=[LateLayer()])
        cache.update(kv(1, 2), kv(1, 2), 0)
        self.kept["c"] = cache

    owner(run)
    f = figures(observer, owner)
    assert f.available and f.live_bytes == storage_bytes(owner.kept["c"])


@pytest.mark.parametrize("sliding", [False, True], ids=["full", "sliding"])
def test_the_peak_of_a_growing_cache_freed_inside_the_call_is_its_largest_storage(
    observer: Observer, sliding: bool
) -> None:
    """Weighed only on the hot path (the cache is gone at the sample): every update must be counted exactly."""
    owner = Owner()
    add(observer, owner)
    window = 6
    largest: list[int] = []

    def run(self: Owner) -> None:
        cache = DynamicCache(config=sliding_config(window)) if sliding else DynamicCache()
        for tokens in (9, 1, 1, 3, 1):
            for layer in range(LAYERS):
                cache.update(kv(2, tokens), kv(2, tokens), layer)
            largest.append(storage_bytes(cache))

    owner(run)
    f = figures(observer, owner)
    assert f.live_bytes == 0 and f.recent_peak_bytes == f.peak_bytes == max(largest)
    per_position = 2 * LAYERS * kv(2, 1).nbytes
    assert max(largest) == (9 if sliding else 15) * per_position, "sliding: the 9-position prefill stays allocated"


def test_every_attention_layer_class_of_the_running_transformers_is_known() -> None:
    """Each KV layer class in the running ``transformers.cache_utils`` is vetted (the fast, exact path) or known to be
    quantized; run on the lowest, the default and the newest transformers (``make test``'s matrix)."""
    layers = [
        cls
        for cls in vars(cache_utils).values()
        if isinstance(cls, type)
        and issubclass(cls, cache_utils.CacheLayerMixin)
        and cls.__module__ == cache_utils.__name__
    ]
    assert layers, "transformers.cache_utils has no layer classes"
    quantized = [c for c in layers if any(k.__name__ in OPAQUE_LAYERS for k in c.__mro__)]
    unknown = [c.__name__ for c in layers if c not in quantized and c.__name__ not in VETTED_KV_ATTRIBUTES]
    unknown.remove("CacheLayerMixin")
    assert unknown == [], f"layer classes the observer reads only by their base: {unknown}"
    assert all("quantized" in (plan_for(c).unknown or "") for c in quantized)
    for cls in layers:
        if cls.__name__ in VETTED_KV_ATTRIBUTES:
            plan = plan_for(cls)
            assert plan.vetted and plan.unknown is None, cls.__name__
            if plan.keys_and_values:
                assert plan.static == issubclass(cls, cache_utils.StaticLayer), cls.__name__
