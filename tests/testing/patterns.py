"""The caches model authors write, as small real owners: one per row of docs/declaring-caches.md's table.

Each keeps real ``transformers`` cache objects the way its pattern does, with the geometry of the
issue's talker (3 layers, 2 kv heads, head dim 16, 40 positions), and says which declaration is right
and, per field, a wrong one. ``drive(model, size)`` runs ``size`` sequences together to their longest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import Qwen2Config
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache, StaticCache

from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver

LAYERS, HEADS, HEAD_DIM, POSITIONS = 3, 2, 16, 40
PREFILL = 8
WINDOW = 8
"""A sliding layer keeps ``WINDOW - 1`` positions, a view into the ``WINDOW`` its last one-position update made."""
ENCODED = 12
"""Positions of the encoder output a cross-attention cache holds."""
CAPTURED = (1, 2, 4)
"""The batch sizes a pool of static caches is captured for."""


def declare(**fields: Any) -> ModelLocalKVSpec:
    """A spec of the talker's geometry, with ``fields`` over it."""
    values: dict[str, Any] = dict(
        name="kv",
        layers=LAYERS,
        kv_heads=HEADS,
        head_dim=HEAD_DIM,
        dtype=torch.float32,
        physical_capacity_positions=POSITIONS,
        capacity_source="POSITIONS",
        scope=ModelLocalKVScope.REQUEST,
        rows=RowDriver.MAX_NUM_SEQS,
    )
    values.update(fields)
    return ModelLocalKVSpec(**values)


def states(rows: int, positions: int = 1) -> torch.Tensor:
    """Keys (or values) ``[rows, HEADS, positions, HEAD_DIM]``."""
    return torch.zeros(rows, HEADS, positions, HEAD_DIM)


class Declaring(torch.nn.Module):
    """An owner that declares ``specs``."""

    def __init__(self, specs: list[ModelLocalKVSpec]) -> None:
        super().__init__()
        self.specs = specs

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        return self.specs


class Talker(Declaring):
    """The issue's speech talker: one ``DynamicCache`` per request in a dict on itself until the request ends.

    A call is one engine step: every active request gets one position (its prompt on the first step); the
    requests that reached their longest end with the step.
    """

    def __init__(self, specs: list[ModelLocalKVSpec]) -> None:
        super().__init__(specs)
        self.caches: dict[int, DynamicCache] = {}

    def forward(self, requests: list[int]) -> None:
        for request in requests:
            cache = self.caches.get(request)
            new = cache is None
            if cache is None:
                cache = self.caches[request] = DynamicCache()
            for layer in range(LAYERS):
                cache.update(states(1, PREFILL if new else 1), states(1, PREFILL if new else 1), layer)
        for request in requests:
            if self.caches[request].get_seq_length() >= POSITIONS:
                del self.caches[request]


class ListTalker(Declaring):
    """The same, its caches in a list of slots (``None`` when free)."""

    def __init__(self, specs: list[ModelLocalKVSpec]) -> None:
        super().__init__(specs)
        self.slots: list[DynamicCache | None] = [None] * 8

    def forward(self, requests: list[int]) -> None:
        for request in requests:
            cache = self.slots[request]
            new = cache is None
            if cache is None:
                cache = self.slots[request] = DynamicCache()
            for layer in range(LAYERS):
                cache.update(states(1, PREFILL if new else 1), states(1, PREFILL if new else 1), layer)
        for request in requests:
            slot = self.slots[request]
            if slot is not None and slot.get_seq_length() >= POSITIONS:
                self.slots[request] = None


def step_requests(model: torch.nn.Module, size: int) -> None:
    """``size`` requests from their first step to their last, together."""
    for _ in range(POSITIONS - PREFILL + 1):
        model(list(range(size)))


class Batched(Declaring):
    """One ``DynamicCache`` for the whole batch, built and filled in each call."""

    def forward(self, batch: int) -> DynamicCache:
        cache = DynamicCache()
        for step in range(POSITIONS - PREFILL + 1):
            for layer in range(LAYERS):
                length = PREFILL if step == 0 else 1
                cache.update(states(batch, length), states(batch, length), layer)
        return cache


def config(layer_types: list[str] | None = None) -> Qwen2Config:
    """A config the caches build their layers from."""
    types = layer_types or ["full_attention"] * LAYERS
    return Qwen2Config(
        num_hidden_layers=len(types),
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        hidden_size=HEADS * HEAD_DIM,
        sliding_window=WINDOW,
        use_sliding_window="sliding_attention" in types,
        layer_types=types,
    )


class Pool(Declaring):
    """A ``StaticCache`` per captured batch size, all captured on the first call; a call uses the smallest that fits."""

    def __init__(self, specs: list[ModelLocalKVSpec]) -> None:
        super().__init__(specs)
        self.pool: dict[int, StaticCache] = {}

    def capture(self) -> None:
        for size in CAPTURED:
            cache = self.pool[size] = StaticCache(config(), max_cache_len=POSITIONS)
            for layer in range(LAYERS):
                cache.update(states(size), states(size), layer)

    def forward(self, batch: int) -> None:
        if not self.pool:
            self.capture()
        size = min(s for s in CAPTURED if s >= batch)
        cache = self.pool[size]
        cache.reset()
        for layer in range(LAYERS):
            cache.update(states(size, PREFILL), states(size, PREFILL), layer)


SLIDING_TYPES = ["full_attention", "sliding_attention"] * 2


class Sliding(Declaring):
    """One batched cache of full and sliding-window layers (2 each), filled a position a step."""

    def forward(self, batch: int) -> DynamicCache:
        cache = DynamicCache(config=config(SLIDING_TYPES))
        for step in range(POSITIONS - PREFILL + 1):
            for layer in range(len(SLIDING_TYPES)):
                length = PREFILL if step == 0 else 1
                cache.update(states(batch, length), states(batch, length), layer)
        return cache


class EncoderDecoder(Declaring):
    """An encoder-decoder cache per call: cross-attention keys of the encoder output, self-attention growing."""

    def forward(self, batch: int) -> EncoderDecoderCache:
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        for layer in range(LAYERS):
            cache.cross_attention_cache.update(states(batch, ENCODED), states(batch, ENCODED), layer)
        for step in range(POSITIONS - PREFILL + 1):
            for layer in range(LAYERS):
                length = PREFILL if step == 0 else 1
                cache.self_attention_cache.update(states(batch, length), states(batch, length), layer)
        return cache


class HandMade(Declaring):
    """Key/value tensors computed by hand into layers built by hand, one ``Cache`` of them per request;
    the layers are updated directly, never through the cache."""

    def __init__(self, specs: list[ModelLocalKVSpec]) -> None:
        super().__init__(specs)
        self.requests: dict[int, Cache] = {}

    def forward(self, requests: list[int]) -> None:
        for request in requests:
            cache = self.requests.get(request)
            new = cache is None
            if cache is None:
                cache = self.requests[request] = Cache(layers=[DynamicLayer() for _ in range(LAYERS)])
            for layer in cache.layers:
                keys = states(1, PREFILL if new else 1)
                layer.update(keys, keys.clone())
        for request in requests:
            if self.requests[request].layers[0].get_seq_length() >= POSITIONS:
                del self.requests[request]


@dataclass(frozen=True)
class Pattern:
    """One way of keeping caches: the owner, how it is driven, its right declaration and a wrong one per field."""

    name: str
    owner: Callable[[list[ModelLocalKVSpec]], torch.nn.Module]
    drive: Callable[[Any, int], None]
    right: Callable[[], list[ModelLocalKVSpec]]
    wrong: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per field, the changes to the first spec that make it wrong."""
    scope: ModelLocalKVScope = ModelLocalKVScope.INVOCATION
    """What the author writes for the scope the check never infers."""
    largest_batch: int = 8

    def model(self, specs: list[ModelLocalKVSpec] | None = None) -> torch.nn.Module:
        """The owner declaring ``specs`` (the right ones by default)."""
        return self.owner(self.right() if specs is None else specs)

    def with_wrong(self, field_name: str) -> torch.nn.Module:
        """The owner with its first spec's ``field_name`` wrong."""
        first, *rest = self.right()
        values = {f: getattr(first, f) for f in first.__dataclass_fields__}
        values.update(self.wrong[field_name])
        return self.owner([ModelLocalKVSpec(**values), *rest])


def drive_batch(model: torch.nn.Module, size: int) -> None:
    """One call at ``size`` sequences."""
    model(size)


GEOMETRY_WRONG: dict[str, dict[str, Any]] = {
    "layers": {"layers": LAYERS - 1},
    "kv_heads": {"kv_heads": HEADS - 1},
    "head_dim": {"head_dim": HEAD_DIM // 2},
    "dtype": {"dtype": torch.float16},
    "physical_capacity_positions": {"physical_capacity_positions": POSITIONS - 1},
}
PER_SEQUENCE_WRONG = {
    **GEOMETRY_WRONG,
    "rows": {"rows": RowDriver.FIXED, "rows_fixed": 1, "rows_reason": "one sequence at a time"},
}

PATTERNS = (
    Pattern(
        "per_request_dict",
        Talker,
        step_requests,
        lambda: [declare(scope=ModelLocalKVScope.REQUEST)],
        PER_SEQUENCE_WRONG,
        ModelLocalKVScope.REQUEST,
    ),
    Pattern(
        "per_request_list",
        ListTalker,
        step_requests,
        lambda: [declare(scope=ModelLocalKVScope.REQUEST)],
        PER_SEQUENCE_WRONG,
        ModelLocalKVScope.REQUEST,
    ),
    Pattern("batched", Batched, drive_batch, lambda: [declare(scope=ModelLocalKVScope.INVOCATION)], PER_SEQUENCE_WRONG),
    Pattern(
        "static_pool",
        Pool,
        drive_batch,
        lambda: [
            declare(
                scope=ModelLocalKVScope.MODEL,
                rows=RowDriver.FIXED,
                rows_fixed=sum(CAPTURED),
                rows_reason="a static cache per captured batch size (1 + 2 + 4)",
            )
        ],
        {
            **GEOMETRY_WRONG,
            "rows": {"rows": RowDriver.MAX_NUM_SEQS},
            "rows_fixed": {"rows_fixed": sum(CAPTURED) - 1},
        },
        ModelLocalKVScope.MODEL,
        largest_batch=max(CAPTURED),
    ),
    Pattern(
        "sliding_window",
        Sliding,
        drive_batch,
        lambda: [
            declare(name="full", layers=2, scope=ModelLocalKVScope.INVOCATION),
            declare(
                name="sliding",
                layers=2,
                physical_capacity_positions=WINDOW,
                capacity_source="sliding_window: window - 1 kept, and the position being added",
                scope=ModelLocalKVScope.INVOCATION,
            ),
        ],
        {**PER_SEQUENCE_WRONG, "layers": {"layers": 1}},
    ),
    Pattern(
        "encoder_decoder",
        EncoderDecoder,
        drive_batch,
        lambda: [
            declare(name="self_attention", scope=ModelLocalKVScope.INVOCATION),
            declare(
                name="cross_attention",
                physical_capacity_positions=ENCODED,
                capacity_source="the encoder's output length",
                scope=ModelLocalKVScope.INVOCATION,
            ),
        ],
        PER_SEQUENCE_WRONG,
    ),
    Pattern(
        "hand_made",
        HandMade,
        step_requests,
        lambda: [declare(scope=ModelLocalKVScope.REQUEST)],
        PER_SEQUENCE_WRONG,
        ModelLocalKVScope.REQUEST,
    ),
)
BY_NAME = {pattern.name: pattern for pattern in PATTERNS}
