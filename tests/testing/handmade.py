"""Issue 47's four hand-made caches, written from scratch as small real owners (our own shapes).

- ``StaticRing``: a sliding-window ring preallocated for ``max_num_seqs`` at first use, as a ``StaticLayer``
  subclass (``MixinRing``: the same ring as a bare ``CacheLayerMixin`` subclass; ``PlainRing``: as plain tensors
  the owner holds);
- ``CrossAttention``: an encoder-decoder cache per request (self-attention grows, cross-attention holds the encoder
  output);
- ``Int8Cache``: int8 keys and values with per-channel float32 scales on the same layer;
- ``Doubling``: a cache that doubles its capacity up to a maximum length in a backing buffer, built by a parent and
  written by two sub-modules.

Each owner is built for the engine's ``max_num_seqs`` (as a vLLM model reads it from its config) and declares the
specs it is given; ``drive(model, size)`` runs ``size`` sequences together to their longest.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, EncoderDecoderCache, StaticLayer

from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver

LAYERS, HEADS, HEAD_DIM = 2, 3, 8
WINDOW = 6
"""Positions a ring keeps per row."""
STEPS = 9
"""Positions written per sequence: more than the window, so a ring wraps."""
DECODED = 7
"""Positions the cross-attention owner's self-attention reaches."""
ENCODED = 5
"""Encoder positions its cross-attention holds."""
START, LONGEST = 4, 16
"""The doubling cache's first capacity and its maximum."""


def declare(**fields: Any) -> ModelLocalKVSpec:
    """A spec of this module's geometry, ``fields`` over it (a ring of ``WINDOW`` positions a sequence)."""
    values: dict[str, Any] = dict(
        name="kv",
        layers=LAYERS,
        kv_heads=HEADS,
        head_dim=HEAD_DIM,
        dtype=torch.float32,
        physical_capacity_positions=WINDOW,
        capacity_source="WINDOW",
        scope=ModelLocalKVScope.MODEL,
        rows=RowDriver.MAX_NUM_SEQS,
    )
    values.update(fields)
    return ModelLocalKVSpec(**values)


def states(rows: int, positions: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Keys (or values) ``[rows, HEADS, positions, HEAD_DIM]``."""
    return torch.randn(rows, HEADS, positions, HEAD_DIM).to(dtype)


class Declaring(torch.nn.Module):
    """An owner built for ``max_num_seqs`` that declares ``specs``."""

    def __init__(self, specs: list[ModelLocalKVSpec], max_num_seqs: int) -> None:
        super().__init__()
        self.specs = specs
        self.max_num_seqs = max_num_seqs

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        return self.specs


class RingLayer(StaticLayer):
    """A ring of ``WINDOW`` positions for every one of ``max_num_seqs`` slots, allocated at first use."""

    def __init__(self, max_num_seqs: int) -> None:
        super().__init__(max_cache_len=WINDOW)
        self.slots = max_num_seqs

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        shape = (self.slots, key_states.shape[1], WINDOW, key_states.shape[-1])
        self.keys = torch.zeros(shape, dtype=key_states.dtype)
        self.values = torch.zeros(shape, dtype=value_states.dtype)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None and self.values is not None
        step = int(kwargs.get("step", 0)) % WINDOW
        rows = key_states.shape[0]
        self.keys[:rows, :, step] = key_states[:, :, 0]
        self.values[:rows, :, step] = value_states[:, :, 0]
        return self.keys[:rows], self.values[:rows]


class MixinRingLayer(CacheLayerMixin):
    """The same ring, written on the bare layer base class."""

    is_sliding = True

    def __init__(self, max_num_seqs: int) -> None:
        super().__init__()
        self.slots = max_num_seqs

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        shape = (self.slots, key_states.shape[1], WINDOW, key_states.shape[-1])
        self.keys = torch.zeros(shape, dtype=key_states.dtype)
        self.values = torch.zeros(shape, dtype=value_states.dtype)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None and self.values is not None
        step = int(kwargs.get("step", 0)) % WINDOW
        rows = key_states.shape[0]
        self.keys[:rows, :, step] = key_states[:, :, 0]
        self.values[:rows, :, step] = value_states[:, :, 0]
        return self.keys[:rows], self.values[:rows]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return WINDOW, 0

    def get_seq_length(self) -> int:
        return WINDOW

    def get_max_length(self) -> int:
        return WINDOW


class StaticRing(Declaring):
    """A ``StaticLayer`` ring per layer, built at the first call and kept for the model's life."""

    layer_class: type = RingLayer

    def __init__(self, specs: list[ModelLocalKVSpec], max_num_seqs: int) -> None:
        super().__init__(specs, max_num_seqs)
        self.ring: Cache | None = None

    def forward(self, size: int) -> None:
        if self.ring is None:
            self.ring = Cache(layers=[self.layer_class(self.max_num_seqs) for _ in range(LAYERS)])
        layers: list[Any] = list(self.ring.layers)
        for step in range(STEPS):
            for layer in layers:
                layer.update(states(size), states(size), step=step)


class MixinRing(StaticRing):
    """The ring of ``MixinRingLayer``s."""

    layer_class = MixinRingLayer


class PlainRing(Declaring):
    """The same ring as plain tensors the owner holds: keys and values ``[max_num_seqs, HEADS, WINDOW, HEAD_DIM]``
    per layer, in two lists, allocated at the first call."""

    def __init__(self, specs: list[ModelLocalKVSpec], max_num_seqs: int) -> None:
        super().__init__(specs, max_num_seqs)
        self.ring_keys: list[torch.Tensor] = []
        self.ring_values: list[torch.Tensor] = []

    def forward(self, size: int) -> None:
        if not self.ring_keys:
            shape = (self.max_num_seqs, HEADS, WINDOW, HEAD_DIM)
            self.ring_keys = [torch.zeros(shape) for _ in range(LAYERS)]
            self.ring_values = [torch.zeros(shape) for _ in range(LAYERS)]
        for step in range(STEPS):
            for keys, values in zip(self.ring_keys, self.ring_values, strict=True):
                keys[:size, :, step % WINDOW] = states(size)[:, :, 0]
                values[:size, :, step % WINDOW] = states(size)[:, :, 0]


class CrossAttention(Declaring):
    """One ``EncoderDecoderCache`` per request: self-attention grows to ``DECODED``, cross-attention holds
    ``ENCODED`` positions of the encoder output; dropped when the request ends (the end of the call)."""

    def forward(self, size: int) -> None:
        requests = {n: EncoderDecoderCache(DynamicCache(), DynamicCache()) for n in range(size)}
        for cache in requests.values():
            for layer in range(LAYERS):
                cache.cross_attention_cache.update(states(1, ENCODED), states(1, ENCODED), layer)
        for _ in range(DECODED):
            for cache in requests.values():
                for layer in range(LAYERS):
                    cache.self_attention_cache.update(states(1), states(1), layer)


class Int8Layer(CacheLayerMixin):
    """int8 keys and values grown by concatenation, with float32 scales per channel of each row's heads
    (``[rows, HEADS, 1, HEAD_DIM]``) for keys and for values, kept on the layer."""

    is_sliding = False

    def __init__(self) -> None:
        super().__init__()
        self.key_scales: torch.Tensor | None = None
        self.value_scales: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, heads, _, dim = key_states.shape
        self.keys = torch.zeros((rows, heads, 0, dim), dtype=torch.int8)
        self.values = torch.zeros((rows, heads, 0, dim), dtype=torch.int8)
        self.key_scales = key_states.abs().amax(dim=2, keepdim=True).float() / 127 + 1e-8
        self.value_scales = value_states.abs().amax(dim=2, keepdim=True).float() / 127 + 1e-8
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.key_scales is not None and self.value_scales is not None
        assert self.keys is not None and self.values is not None
        keys = (key_states / self.key_scales).round().clamp(-127, 127).to(torch.int8)
        values = (value_states / self.value_scales).round().clamp(-127, 127).to(torch.int8)
        self.keys = torch.cat([self.keys, keys], dim=2)
        self.values = torch.cat([self.values, values], dim=2)
        return self.keys.float() * self.key_scales, self.values.float() * self.value_scales

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])

    def get_max_length(self) -> int:
        return -1


class Int8Cache(Declaring):
    """One int8 cache for the batch a call: ``STEPS`` positions a row, then dropped."""

    def forward(self, size: int) -> None:
        cache = Cache(layers=[Int8Layer() for _ in range(LAYERS)])
        layers: list[Any] = list(cache.layers)
        for _ in range(STEPS):
            for layer in layers:
                layer.update(states(size), states(size))


class DoublingLayer(CacheLayerMixin):
    """Keys and values are views into one backing buffer each, whose capacity doubles (from ``START``) when full,
    up to ``LONGEST`` positions."""

    is_sliding = False

    def __init__(self) -> None:
        super().__init__()
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, heads, _, dim = key_states.shape
        self.key_buffer = torch.zeros((rows, heads, START, dim), dtype=key_states.dtype)
        self.value_buffer = torch.zeros((rows, heads, START, dim), dtype=value_states.dtype)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.key_buffer is not None and self.value_buffer is not None
        new = key_states.shape[2]
        capacity = self.key_buffer.shape[2]
        if self.length + new > capacity:
            grown = min(LONGEST, max(capacity * 2, self.length + new))
            self.key_buffer = _grow(self.key_buffer, grown)
            self.value_buffer = _grow(self.value_buffer, grown)
        end = self.length + new
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self.keys = self.key_buffer[:, :, :end]
        self.values = self.value_buffer[:, :, :end]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return LONGEST


def _grow(buffer: torch.Tensor, positions: int) -> torch.Tensor:
    grown = torch.zeros((*buffer.shape[:2], positions, buffer.shape[3]), dtype=buffer.dtype)
    grown[:, :, : buffer.shape[2]] = buffer
    return grown


class Writer(torch.nn.Module):
    """A sub-module that writes its layer of its parent's cache (``specs``: what it wrongly declares, if any)."""

    def __init__(self, index: int, specs: list[ModelLocalKVSpec] | None = None) -> None:
        super().__init__()
        self.index = index
        self.specs = specs

    def forward(self, cache: Cache, size: int) -> None:
        layer: Any = cache.layers[self.index]
        layer.update(states(size), states(size))


class DeclaringWriter(Writer):
    """A writer that declares ``specs`` (a cache its parent holds: wrong)."""

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        return self.specs or []


class Doubling(Declaring):
    """The parent builds one doubling cache a call (a layer per writer) and holds it; its two writers fill it to
    ``LONGEST`` positions a row."""

    def __init__(
        self, specs: list[ModelLocalKVSpec], max_num_seqs: int, writer_specs: list[ModelLocalKVSpec] | None = None
    ) -> None:
        super().__init__(specs, max_num_seqs)
        writer = Writer if writer_specs is None else DeclaringWriter
        self.first = writer(0, writer_specs)
        self.second = writer(1, writer_specs)
        self.cache: Cache | None = None

    def forward(self, size: int) -> None:
        self.cache = Cache(layers=[DoublingLayer() for _ in range(LAYERS)])
        for _ in range(LONGEST):
            self.first(self.cache, size)
            self.second(self.cache, size)
        self.cache = None


def drive(model: torch.nn.Module, size: int) -> None:
    """One call at ``size`` sequences."""
    model(size)
