"""vLLM 0.34's extensible KV cache: what it has committed on the device, and what it reserved.

vLLM 0.34 (`vllm/v1/worker/extensible_kv_cache.py`) maps the paged KV cache with the driver,
outside torch's caching allocator. ``initialize_from_config`` reserves address space for the
config's ``num_blocks`` (``capacity_blocks``, ``size`` bytes) and commits only the first
blocks; warm-up commits more and gives them back; ``EngineCore`` then calls
``extend_kv_cache(num_blocks)``, which commits the final size (or shrinks to it). Sleep mode and
a weight update that borrows the cache release its pages and recommit them
(``release_physical``, ``recommit``): ``physical_bytes`` drops to 0 and comes back, while
``num_committed_blocks`` keeps the size to recommit.

The hook reads only plain figures the cache keeps (``physical_bytes``, ``num_committed_blocks``,
``size``, ``capacity_blocks``, and what vLLM keeps free for torch beside it: ``reserved_headroom_bytes``,
``torch_reserve_growth_bytes``) and keeps no reference to the cache, its buffer or the worker
beyond a weak one. A worker whose runner has no ``extensible_kv_cache`` (vLLM before 0.34, a CPU
worker, ``--no-enable-extensible-kv-cache``) has none of these figures.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modelkv_exporter.contract.snapshot import MemorySample, TorchSegment
from modelkv_exporter.engine.samplers import MemorySampler, PrivatePools

SOURCE = "paged_kv_committed"
"""The measured source that carries the bytes committed at each sample."""


@dataclass(frozen=True)
class ExtensibleKV:
    """An extensible KV cache's figures at one moment."""

    committed_bytes: int
    """Bytes mapped on the device now, granule rounding included (``physical_bytes``)."""
    committed_blocks: int
    """Blocks committed, kept while the pages are released for sleep (``num_committed_blocks``)."""
    reserved_bytes: int
    """Bytes of the allocation the reservation covers, committed or not (``size``)."""
    reserved_blocks: int
    """Blocks the reservation holds (``capacity_blocks``)."""
    torch_headroom_bytes: int | None = None
    """What vLLM keeps free for torch when it sizes the cache: the larger of ``reserved_headroom_bytes`` and
    ``torch_reserve_growth_bytes`` (None: the cache keeps neither)."""


def _count(owner: Any, name: str) -> int | None:
    try:
        value = getattr(owner, name, None)
    except Exception:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


def extensible_cache(worker: Any) -> Any | None:
    """The worker's runner's ``extensible_kv_cache``, or None when it has none (or cannot be asked)."""
    try:
        return getattr(getattr(worker, "model_runner", None), "extensible_kv_cache", None)
    except Exception:
        return None


def figures_of(cache: Any) -> ExtensibleKV | None:
    """The cache's figures, or None when it is no extensible KV cache (any figure missing or not a count)."""
    if cache is None:
        return None
    committed, blocks, size, capacity = (
        _count(cache, name) for name in ("physical_bytes", "num_committed_blocks", "size", "capacity_blocks")
    )
    if committed is None or blocks is None or size is None or capacity is None:
        return None
    kept = [_count(cache, name) for name in ("reserved_headroom_bytes", "torch_reserve_growth_bytes")]
    headroom = max((value for value in kept if value is not None), default=None)
    return ExtensibleKV(committed, blocks, size, capacity, headroom)


def committed_reader(worker: Any) -> Callable[[], int | None]:
    """A function giving the bytes the worker's extensible KV cache has committed now (None: no such cache).

    It holds the worker weakly: the worker, its runner and its cache are never kept alive by it.
    """
    try:
        ref: Callable[[], Any] = weakref.ref(worker)
    except TypeError:
        return lambda: None

    def read() -> int | None:
        figures = figures_of(extensible_cache(ref()))
        return None if figures is None else figures.committed_bytes

    return read


class WithExtensibleKV(MemorySampler):
    """A sampler that adds ``paged_kv_committed`` to another's samples where the worker has an extensible cache.

    Every other figure, the peak resets and their holds are the inner sampler's.
    """

    def __init__(self, inner: MemorySampler, committed: Callable[[], int | None]) -> None:
        self.inner = inner
        self.committed = committed

    def _add(self, sample: MemorySample) -> MemorySample:
        try:
            value = self.committed()
        except Exception:
            value = None
        if value is None:
            return sample
        return MemorySample(sample.sampled_at, {**sample.values, SOURCE: value})

    def __call__(self) -> MemorySample:
        return self._add(self.inner())

    def initialised(self, profiled_activation_peak: int | None = None) -> MemorySample:
        return self._add(self.inner.initialised(profiled_activation_peak))

    def private_pools(self) -> PrivatePools | None:
        return self.inner.private_pools()

    def largest_segments(self) -> tuple[TorchSegment, ...] | None:
        return self.inner.largest_segments()

    def hold_resets(self) -> Callable[[], None] | None:
        """The inner sampler's ``hold_resets``, where it has one (a CUDA sampler)."""
        hold = getattr(self.inner, "hold_resets", None)
        return hold() if callable(hold) else None
