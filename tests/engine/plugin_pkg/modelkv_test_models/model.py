"""A Qwen2 whose module tree holds a real transformers StaticCache that declares itself."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

from modelkv_exporter.demo.owners import StaticCacheOwner
from modelkv_exporter.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver, spec_from_hf_config

CAPACITY = 64


class DeclaringCacheOwner(StaticCacheOwner):
    """Holds one StaticCache row per sequence, allocated at load, and declares it."""

    def __init__(self, hf_config: PretrainedConfig, dtype: torch.dtype, rows: int) -> None:
        super().__init__(hf_config, dtype)
        self.allocate(rows)

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        return [
            spec_from_hf_config(
                self.config,
                name="test_static_cache",
                dtype=self.dtype,
                physical_capacity_positions=CAPACITY,
                capacity_source=f"test constant {CAPACITY}",
                scope=ModelLocalKVScope.REQUEST,
                rows=RowDriver.MAX_NUM_SEQS,
            )
        ]


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
