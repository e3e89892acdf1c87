"""The paged KV cache of a worker: bytes of its device backing allocation(s) and blocks of its pool.

In vLLM 0.30 to 0.33 every device ``KVCacheTensor`` of a ``KVCacheConfig`` describes the
same backing allocation (``allocate_kv_cache`` asserts one size and allocates one buffer);
the KV-cache groups of a hybrid model (sliding-window and full attention layers) are views
that overlay it. So the sum of ``size`` over the tensors counts that buffer once per group.
Tensors vLLM marks ``host_resident`` (HiSparse) live in a host pool, not on the device.

The bytes come from the runner's KV tensors when it has them: each distinct storage once.
Otherwise from the config: one allocation when the tensors carry vLLM's shared-buffer layout
(``layer_stride``), else one allocation per tensor. Blocks are the config's ``num_blocks``,
the pool every group draws from.
"""

from __future__ import annotations

from typing import Any

from modelkv_exporter.engine.weights import storage_bytes


def _device_tensors(kv_cache_config: Any) -> list[Any] | None:
    tensors = getattr(kv_cache_config, "kv_cache_tensors", None)
    if tensors is None:
        return None
    return [t for t in tensors if not getattr(t, "host_resident", False)]


def bytes_from_config(kv_cache_config: Any) -> int | None:
    """Device bytes as the config describes them; None without a config."""
    tensors = _device_tensors(kv_cache_config)
    if tensors is None:
        return None
    if not tensors:
        return 0
    if all(hasattr(t, "layer_stride") for t in tensors):
        return max(int(t.size) for t in tensors)
    return sum(int(t.size) for t in tensors)


def runner_caches(runner: Any) -> list[Any]:
    """The runner's paged KV tensors (``kv_caches``), where it has them."""
    caches = getattr(runner, "kv_caches", None)
    if not isinstance(caches, (list, tuple)):
        return []
    return [c for c in caches if hasattr(c, "untyped_storage") and hasattr(c, "device")]


def paged_kv_bytes(kv_cache_config: Any, runner: Any) -> int | None:
    """Device bytes of the paged KV cache: the runner's tensors, else the config; None when unknown.

    The tensors are used only when no tensor is host-resident (the runner's list does not say
    which of its tensors those are).
    """
    all_tensors = getattr(kv_cache_config, "kv_cache_tensors", None) or ()
    if not any(getattr(t, "host_resident", False) for t in all_tensors):
        measured = storage_bytes(runner_caches(runner))
        if measured is not None:
            return measured
    return bytes_from_config(kv_cache_config)


def paged_kv_blocks(kv_cache_config: Any, cache_config: Any) -> int | None:
    """Blocks of the device pool: the config's ``num_blocks``, else ``cache_config.num_gpu_blocks``."""
    for value in (getattr(kv_cache_config, "num_blocks", None), getattr(cache_config, "num_gpu_blocks", None)):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None
