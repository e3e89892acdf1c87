"""Small real owners for the check's own tests: real ``transformers`` caches, geometry chosen by the test."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache, Qwen2Config

from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver

LAYERS, HEADS, HEAD_DIM, LENGTH = 2, 2, 4, 8
ROW = 2 * LAYERS * HEADS * HEAD_DIM * LENGTH * 4
"""Bytes of one row of a full cache: K and V, ``LAYERS`` layers, ``LENGTH`` positions, float32."""


def spec(**changes: Any) -> ModelLocalKVSpec:
    """The right declaration of ``Generator``'s cache, with ``changes``."""
    fields: dict[str, Any] = dict(
        name="kv",
        layers=LAYERS,
        kv_heads=HEADS,
        head_dim=HEAD_DIM,
        dtype=torch.float32,
        physical_capacity_positions=LENGTH,
        capacity_source="LENGTH",
        scope=ModelLocalKVScope.INVOCATION,
        rows=RowDriver.MAX_NUM_SEQS,
    )
    fields.update(changes)
    return ModelLocalKVSpec(**fields)


class Generator(torch.nn.Module):
    """Builds a ``DynamicCache`` per call, one row per sequence, and fills it a position a step up to ``length``."""

    def __init__(self, specs: list[ModelLocalKVSpec] | None = None) -> None:
        super().__init__()
        self.specs = [spec()] if specs is None else specs

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        return self.specs

    def forward(self, batch: int, length: int = LENGTH) -> DynamicCache:
        cache = DynamicCache()
        for _ in range(length):
            for layer in range(LAYERS):
                states = torch.randn(batch, HEADS, 1, HEAD_DIM)
                cache.update(states, states.clone(), layer)
        return cache


class Idle(torch.nn.Module):
    """Declares a cache and never builds one."""

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        return [spec()]

    def forward(self, batch: int) -> int:
        return batch


class Windowed(torch.nn.Module):
    """Keeps nothing it declares: a sliding-window cache of ``window`` fed chunks larger than one position."""

    def __init__(self, window: int) -> None:
        super().__init__()
        self.config = Qwen2Config(
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=HEADS,
            hidden_size=HEADS * HEAD_DIM,
            sliding_window=window,
            use_sliding_window=True,
            layer_types=["sliding_attention"] * LAYERS,
        )

    def forward(self, batch: int, chunks: int = 4, chunk: int = 5) -> DynamicCache:
        cache = DynamicCache(config=self.config)
        for _ in range(chunks):
            for layer in range(LAYERS):
                states = torch.randn(batch, HEADS, chunk, HEAD_DIM)
                cache.update(states, states.clone(), layer)
        return cache


def drive(model: torch.nn.Module, batch: int) -> None:
    """One call at ``batch`` sequences."""
    model(batch)
