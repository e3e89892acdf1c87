"""Engine ids where engines are many: data-parallel replicas of a dense model, ranks, two engines in one process.

vLLM 0.30 to 0.34 set ``data_parallel_rank`` to 0 in every replica of a dense model (the engine core calls
``ParallelConfig.reconfigure_for_independent_dp_rank`` after recording the replica's ``data_parallel_index``).
The configs here are the installed vLLM's own ``ParallelConfig`` objects, put through that same call; vLLM
0.34's engine core is read from its wheel (it needs a CUDA torch).
"""

from __future__ import annotations

import gc
import re
from types import SimpleNamespace
from typing import Any

import pytest

from modelkv_exporter.engine.vllm_hook.identity import (
    claim_engine_id,
    data_parallel_index,
    engine_id_for,
    identity_of,
    memory_utilization,
)
from tests.support import vllm_wheel


def dense_replica(index: int, size: int = 2) -> Any:
    """The ``ParallelConfig`` of replica ``index`` of a dense model, as vLLM's engine core leaves it."""
    from vllm.config import ParallelConfig

    config = ParallelConfig(data_parallel_size=size, data_parallel_rank=index)
    config.data_parallel_index = index
    config.reconfigure_for_independent_dp_rank()
    return config


def worker_of(parallel_config: Any, **cache: Any) -> SimpleNamespace:
    return SimpleNamespace(
        vllm_config=SimpleNamespace(
            model_config=SimpleNamespace(model="/models/qwen3", served_model_name="qwen3", architectures=["Qwen3"]),
            parallel_config=parallel_config,
            cache_config=SimpleNamespace(**cache),
            scheduler_config=SimpleNamespace(max_num_seqs=8),
        ),
        device=SimpleNamespace(type="cpu"),
        local_rank=0,
    )


def test_dense_data_parallel_replicas_of_the_installed_vllm_get_ids_of_their_own() -> None:
    replicas = [dense_replica(index, size=4) for index in range(4)]
    assert {config.data_parallel_rank for config in replicas} == {0}, "vLLM's rank is 0 in every dense replica"
    ids = [engine_id_for(identity_of(worker_of(config)), None) for config in replicas]
    assert ids == [f"qwen3-dp{index}" for index in range(4)], "no TP or PP group outside an engine: no rank"


def test_without_an_index_the_rank_is_the_replica() -> None:
    assert data_parallel_index(SimpleNamespace(data_parallel_rank=3)) == 3
    assert data_parallel_index(SimpleNamespace(data_parallel_index=2, data_parallel_rank=0)) == 2
    assert data_parallel_index(SimpleNamespace()) is None


def test_vllm_034_s_engine_core_records_the_index_before_it_resets_a_dense_replica_s_rank() -> None:
    core = vllm_wheel.source(vllm_wheel.wheel("0.34.0"), "vllm/v1/engine/core.py")
    recorded = core.index("parallel_config.data_parallel_index = dp_rank")
    reset = core.index("parallel_config.reconfigure_for_independent_dp_rank()", recorded)
    assert re.search(r"if data_parallel and vllm_config\.model_config\.is_moe:", core[recorded:reset])
    parallel = vllm_wheel.source(vllm_wheel.wheel("0.34.0"), "vllm/config/parallel.py")
    body = parallel[parallel.index("def reconfigure_for_independent_dp_rank") :][:800]
    assert "self.data_parallel_rank = 0" in body and "data_parallel_index" not in body


def test_the_share_of_the_device_is_vllm_034_s_resolved_one() -> None:
    class CacheConfig:
        gpu_memory_utilization = None
        enable_extensible_kv_cache = True

        @property
        def resolved_gpu_memory_utilization(self) -> float:
            return 1.0 if self.enable_extensible_kv_cache else 0.92

    assert memory_utilization(CacheConfig()) == 1.0, "0.34 leaves the setting None and resolves it"
    assert memory_utilization(SimpleNamespace(gpu_memory_utilization=0.85)) == 0.85, "0.30 to 0.33"
    assert memory_utilization(SimpleNamespace(gpu_memory_utilization=None)) is None


class Worker:
    """Any object vLLM could make a worker of (weakly referable)."""


def test_two_engines_in_one_process_claim_ids_of_their_own_and_keep_them() -> None:
    first, second, third = Worker(), Worker(), Worker()
    assert claim_engine_id("policy-dp0-tp0-pp0", first) == "policy-dp0-tp0-pp0"
    assert claim_engine_id("policy-dp0-tp0-pp0", second) == "policy-dp0-tp0-pp0-e1"
    assert claim_engine_id("policy-dp0-tp0-pp0", first) == "policy-dp0-tp0-pp0", "a reload keeps its id"
    assert claim_engine_id("policy-dp0-tp0-pp0", third) == "policy-dp0-tp0-pp0-e2"
    del first
    gc.collect()
    assert claim_engine_id("policy-dp0-tp0-pp0", Worker()) == "policy-dp0-tp0-pp0", "a gone worker frees its id"


@pytest.mark.parametrize("index", [0, 1])
def test_a_replica_s_engine_id_names_its_index_in_the_snapshot_ranks(index: int) -> None:
    from modelkv_exporter.contract.snapshot import EngineIdentity

    identity = identity_of(worker_of(dense_replica(index)))
    assert EngineIdentity("x", dp_index=identity["dp_index"]).ranks_label == f"dp{index}"
