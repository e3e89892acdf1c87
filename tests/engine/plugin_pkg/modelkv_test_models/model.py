"""A Qwen2 whose module tree holds a real transformers StaticCache that declares itself."""

from __future__ import annotations

import torch
from torch import nn
from transformers import StaticCache
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

from modelkv_exporter.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver, spec_from_hf_config

CAPACITY = 64


class DeclaringCacheOwner(nn.Module):
    """Holds one StaticCache row per sequence, allocated at load, and declares it."""

    def __init__(self, hf_config: object, dtype: torch.dtype, rows: int) -> None:
        super().__init__()
        self.hf_config = hf_config
        self.cache_dtype = dtype
        self.cache = StaticCache(config=hf_config, max_cache_len=CAPACITY)
        spec = self.model_local_kv_specs()[0]
        states = torch.zeros(rows, spec.kv_heads, 1, spec.head_dim, dtype=dtype)
        for layer in range(spec.layers):
            self.cache.update(states, states, layer, cache_kwargs={"cache_position": torch.arange(1)})

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        return [
            spec_from_hf_config(
                self.hf_config,
                name="test_static_cache",
                dtype=self.cache_dtype,
                physical_capacity_positions=CAPACITY,
                capacity_source=f"test constant {CAPACITY}",
                scope=ModelLocalKVScope.REQUEST,
                rows=RowDriver.MAX_NUM_SEQS,
            )
        ]

    def held_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.cache.layers for t in (layer.keys, layer.values))


class BrokenDeclarer(nn.Module):
    """A declarer with a bug: the engine must load and serve anyway."""

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        raise RuntimeError("deliberately broken declarer")


class ModelKVTestForCausalLM(Qwen2ForCausalLM):
    """Qwen2 plus a talker-like submodule owning model-local KV, and a broken declarer."""

    def __init__(self, *, vllm_config: object, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        model_config = vllm_config.model_config  # type: ignore[attr-defined]
        rows = vllm_config.scheduler_config.max_num_seqs  # type: ignore[attr-defined]
        self.talker = nn.Module()
        self.talker.kv_owner = DeclaringCacheOwner(model_config.hf_config, model_config.dtype, rows)
        self.broken = BrokenDeclarer()
