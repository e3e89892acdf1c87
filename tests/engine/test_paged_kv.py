"""Paged KV bytes and blocks from vLLM's own ``KVCacheConfig`` classes and real tensors.

A hybrid model's KV-cache groups overlay one backing buffer, so every ``KVCacheTensor`` carries
that buffer's size; the sum over tensors (what the hook published before) counts it once per group.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheTensor

from modelkv_exporter.engine.vllm_hook.paged_kv import (
    bytes_from_config,
    paged_kv_blocks,
    paged_kv_bytes,
)
from modelkv_exporter.engine.weights import storage_bytes

PAGE = 4096
BLOCKS = 32
SIZE = PAGE * BLOCKS


def hybrid(groups: int, host_resident: bool = False) -> KVCacheConfig:
    tensors = [
        KVCacheTensor(size=SIZE, layers=[f"layer{i}"], layer_stride=SIZE, block_stride=PAGE) for i in range(groups)
    ]
    if host_resident:
        tensors.append(
            KVCacheTensor(
                size=7 * SIZE, layers=["hisparse"], layer_stride=7 * SIZE, block_stride=PAGE, host_resident=True
            )
        )
    return KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=tensors, kv_cache_groups=[])


def views_of_one_buffer(config: KVCacheConfig) -> list[torch.Tensor]:
    """What vLLM's allocate_kv_cache hands the runner: strided views into one int8 buffer per device."""
    buffer = torch.zeros(SIZE, dtype=torch.int8)
    return [buffer.view(BLOCKS, PAGE) for t in config.kv_cache_tensors if not t.host_resident for _ in t.layers]


def test_groups_that_overlay_one_buffer_count_it_once() -> None:
    for groups in (1, 2, 4):
        config = hybrid(groups)
        assert bytes_from_config(config) == SIZE
        assert paged_kv_bytes(config, SimpleNamespace(kv_caches=views_of_one_buffer(config))) == SIZE
        assert sum(t.size for t in config.kv_cache_tensors) == SIZE * groups, "the old sum: once per group"


def test_views_at_different_offsets_of_one_storage_count_once() -> None:
    buffer = torch.zeros(2 * SIZE, dtype=torch.int8)
    layers = [buffer[:SIZE], buffer[SIZE:]]  # a uniform model: one tensor, one layer per half
    assert layers[0].data_ptr() != layers[1].data_ptr()
    assert storage_bytes(layers) == 2 * SIZE
    assert storage_bytes([torch.zeros(8), torch.zeros(8)]) == 64, "two allocations are two"
    assert storage_bytes([]) is None


def test_host_resident_tensors_are_not_device_memory() -> None:
    config = hybrid(2, host_resident=True)
    runner = SimpleNamespace(kv_caches=views_of_one_buffer(config))
    assert bytes_from_config(config) == SIZE
    assert paged_kv_bytes(config, runner) == SIZE
    assert bytes_from_config(KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[])) == 0


def test_without_tensors_the_config_answers_and_a_layout_of_own_buffers_is_summed() -> None:
    assert paged_kv_bytes(hybrid(2), SimpleNamespace()) == SIZE
    assert paged_kv_bytes(hybrid(2), SimpleNamespace(kv_caches=[[torch.zeros(4)]])) == SIZE, (
        "nested lists are no tensors"
    )
    own_buffers = SimpleNamespace(
        kv_cache_tensors=[SimpleNamespace(size=SIZE, shared_by=["a"]), SimpleNamespace(size=SIZE, shared_by=["b"])]
    )
    assert bytes_from_config(own_buffers) == 2 * SIZE
    assert paged_kv_bytes(None, SimpleNamespace()) is None


def test_blocks_come_from_the_config_before_cache_config() -> None:
    assert paged_kv_blocks(hybrid(2), SimpleNamespace(num_gpu_blocks=None)) == BLOCKS
    assert paged_kv_blocks(None, SimpleNamespace(num_gpu_blocks=12)) == 12
    assert paged_kv_blocks(None, SimpleNamespace(num_gpu_blocks=None)) is None
