"""Does this ``transformers`` keep its caches the way the observer reads them? Checked by behaviour at install.

``names`` checks the classes and methods the hooks need exist; ``self_test`` builds tiny caches
of each kind through the installed hooks and compares the observer's figure with an independent
count of the same storages. Either failing makes every figure absent, with the reason.
"""

from __future__ import annotations

from typing import Any

import torch

from modelkv_exporter.engine.observe import hooks
from modelkv_exporter.engine.observe.layers import kv_bytes
from modelkv_exporter.engine.observe.records import OwnerState

NEEDED = ("Cache", "CacheLayerMixin", "DynamicCache", "StaticCache", "EncoderDecoderCache", "DynamicLayer")


def names() -> tuple[Any, str | None]:
    """``transformers.cache_utils`` and None, or None and what is missing."""
    try:
        from transformers import cache_utils
    except Exception as error:
        return None, f"transformers.cache_utils does not import: {error}"
    missing = [name for name in NEEDED if not hasattr(cache_utils, name)]
    if missing:
        return None, f"transformers.cache_utils lacks {missing}"
    for method in ("update", "lazy_initialization"):
        if not callable(getattr(cache_utils.CacheLayerMixin, method, None)):
            return None, f"CacheLayerMixin has no {method}()"
    return cache_utils, None


def _tiny_caches(cache_utils: Any, batch: int, heads: int, head_dim: int) -> tuple[str | None, int]:
    """Fill one cache of each kind; returns (problem, independent byte count). The caches die on return."""
    from transformers import PretrainedConfig

    states = torch.ones(batch, heads, 5, head_dim)
    dynamic = cache_utils.DynamicCache()
    for index in range(2):
        dynamic.update(states, states, index)
    config = PretrainedConfig()
    config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads = 2, heads, heads
    config.hidden_size, config.sliding_window = heads * head_dim, 4
    config.layer_types = ["sliding_attention", "full_attention"]
    mixed = cache_utils.DynamicCache(config=config)
    for index in range(2):
        mixed.update(states, states, index)
    full = PretrainedConfig()
    full.num_hidden_layers, full.num_attention_heads = 2, heads
    full.num_key_value_heads, full.hidden_size = heads, heads * head_dim
    static = cache_utils.StaticCache(config=full, max_cache_len=8)
    for index in range(2):
        static.update(states, states, index, {"cache_position": torch.arange(5)})
    encoder = cache_utils.EncoderDecoderCache(cache_utils.DynamicCache(), cache_utils.DynamicCache())
    encoder.self_attention_cache.update(states, states, 0)
    layers = [layer for cache in (dynamic, mixed, static, encoder.self_attention_cache) for layer in cache.layers]
    unseen = [type(layer).__name__ for layer in layers if id(layer) not in hooks.records]
    if unseen:
        return f"layer updates did not reach the hooks for {unseen}", 0
    if {type(layer).__name__ for layer in mixed.layers} != {"DynamicSlidingWindowLayer", "DynamicLayer"}:
        return "DynamicCache(config) does not build sliding and full layers from layer_types", 0
    shapes = {(*layer.keys.shape[:2], layer.keys.shape[-1]) for layer in layers}
    if shapes != {(batch, heads, head_dim)}:
        return f"cache layers do not hold [batch, heads, positions, head_dim] keys: {shapes}", 0
    static_bytes = sum(kv_bytes(layer) for layer in static.layers)
    if static_bytes != 2 * 2 * batch * heads * 8 * head_dim * 4:
        return f"StaticCache does not preallocate max_cache_len positions ({static_bytes} bytes)", 0
    return None, sum(t.untyped_storage().nbytes() for layer in layers for t in (layer.keys, layer.values))


def self_test(cache_utils: Any) -> str | None:
    """Run tiny caches through the installed hooks; None when the observer's count is exact."""
    probe = OwnerState("<probe>", object())
    token = hooks.running.set(probe)
    try:
        problem, independent = _tiny_caches(cache_utils, 2, 3, 4)
        if problem is not None:
            return problem
        with hooks.lock:  # a layer someone still holds (a cycle, with the collector off) stays attributed
            hooks.drain()
            held = sum(r.bytes for r in list(hooks.records.values()) if r.owner is probe and r() is not None)
        if probe.high_water != independent:
            return f"observed a high-water of {probe.high_water} bytes where the caches held {independent}"
        if probe.live != held:
            return f"{probe.live - held} bytes still attributed after the probe's caches were freed"
        return None
    finally:
        hooks.running.reset(token)
        for key, record in list(hooks.records.items()):
            if record.owner is probe:
                del hooks.records[key]
