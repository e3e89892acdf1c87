"""Helpers of the observation tests: an owner that runs what it is handed, and independent byte counts."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import EncoderDecoderCache, Qwen2Config

from modelkv_exporter.contract.snapshot import Observation
from modelkv_exporter.engine.engine_log import flush
from modelkv_exporter.engine.observe import Observer

HEADS, HEAD_DIM, LAYERS = 2, 8, 3


def storage_bytes(*caches: Any) -> int:
    """Independent count: the distinct storages behind every layer's keys and values."""
    seen: dict[int, int] = {}
    for cache in caches:
        parts = (
            (cache.self_attention_cache, cache.cross_attention_cache)
            if isinstance(cache, EncoderDecoderCache)
            else (cache,)
        )
        for part in parts:
            for layer in part.layers:
                for tensor in (layer.keys, layer.values):
                    if isinstance(tensor, torch.Tensor):
                        storage = tensor.untyped_storage()
                        seen[storage.data_ptr() or id(tensor)] = storage.nbytes()
    return sum(seen.values())


def kv(batch: int, tokens: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random key or value states ``[batch, HEADS, tokens, HEAD_DIM]``."""
    return torch.randn(batch, HEADS, tokens, HEAD_DIM).to(dtype)


def sliding_config(window: int, layers: int = LAYERS) -> Qwen2Config:
    """Every layer a sliding-window layer of ``window`` positions."""
    return Qwen2Config(
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        hidden_size=HEADS * HEAD_DIM,
        sliding_window=window,
        use_sliding_window=True,
        layer_types=["sliding_attention"] * layers,
    )


def full_config(layers: int = LAYERS) -> Qwen2Config:
    """Every layer a full-attention layer."""
    return Qwen2Config(
        num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=HEADS, hidden_size=HEADS * HEAD_DIM
    )


class Owner(torch.nn.Module):
    """A declarer whose methods run whatever callable the test hands them."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[str, Any] = {}

    def model_local_kv_specs(self) -> list[object]:
        return []

    def forward(self, run: Callable[[Owner], Any]) -> Any:
        return run(self)

    def side_entry(self, run: Callable[[Owner], Any]) -> Any:
        """A public method other than forward (as Ming's generate_latents)."""
        return self._inner(run)

    def _inner(self, run: Callable[[Owner], Any]) -> Any:
        return run(self)


def add(observer: Observer, *owners: object) -> None:
    """Observe ``owners``, each under its id as its path."""
    observer.add_owners((str(id(owner)), owner) for owner in owners)


def figures(observer: Observer, owner: object) -> Observation:
    """``owner``'s observation from a fresh sample (which starts the next interval)."""
    return next(o for o in observer.sample() if o.owner == str(id(owner)))


@contextlib.contextmanager
def engine_log_handler(handler: logging.Handler) -> Iterator[None]:
    """``handler`` on the engine side's logger at INFO for the block, with the report queue flushed on either side."""
    flush()
    logger = logging.getLogger("vllm.modelkv_exporter")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.level = level
        flush()
