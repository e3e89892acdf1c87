"""A stand-in for vLLM 0.34's GPU worker with an extensible KV cache, on a simulated device.

Built from vLLM 0.34.0's released source (``vllm/v1/worker/extensible_kv_cache.py``,
``vllm/utils/extensible_tensor.py``, ``vllm/v1/worker/gpu_worker.py``, ``vllm/v1/engine/core.py``):

- ``StandInKVCache`` keeps the figures ``ExtensibleKVCache`` keeps (``size``, ``capacity_blocks``,
  ``num_committed_blocks``, ``physical_bytes``) and commits as it does: segments of
  ``capacity_blocks`` blocks, each committed as a prefix mapped in 2 MiB granules, grow-only
  unless ``shrink``; ``release_physical`` drops every page and keeps the block count,
  ``recommit`` maps it again. Its pages are device memory outside torch's caching allocator.
- ``StandInWorker`` has the 0.34 ``Worker`` methods the engine core calls, in their order
  (``run_engine_core``): load, profile, ``initialize_from_config`` (reserve, commit the null
  block), ``compile_or_warm_up_model`` (warm-up commits blocks, gives them back, captures graphs),
  ``extend_kv_cache`` (the final commit, or a shrink), then ``sleep``/``wake_up``.
- ``Gpu`` is the device: torch's allocator (live, reserved, peak, the private pools' segments as
  ``memory_snapshot`` lists them), the CUDA context, pages mapped outside torch, memory other
  libraries of the process map (NCCL), and a neighbour process on the same card; it answers as
  ``torch.cuda`` and NVML do.
- ``SleepAllocator`` keeps the books vLLM's ``CuMemAllocator`` keeps (one record per allocation: its
  size, tag, whether it is asleep) for a worker with sleep mode, whose weights, runtime buffers, graph
  pool and (torch-allocated) KV cache live in its pool; ``sleep`` unmaps them as vLLM 0.34's CuMem
  backend does (torch's figures do not move, NVML's do) and ``wake_up(tags)`` maps them again.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

MIB = 1024**2
GIB = 1024**3
GRANULE = 2 * MIB


class Gpu:
    """One device as torch and NVML see it: allocator figures, the context, pages mapped outside torch, a neighbour."""

    class NVMLError(Exception):
        pass

    def __init__(self, total: int = 80 * GIB, context: int = 500 * MIB) -> None:
        self.total = total
        self.context = context
        self.allocated = 0
        self.reserved = 0
        self.peak = 0
        self.mapped = 0
        self.pool = 0
        """Bytes of segments in private pools (CUDA graph pools), part of ``reserved``."""
        self.pool_free = 0
        """Of ``pool``, the free blocks (a graph's intermediate tensors, freed after the capture)."""
        self.other = 0
        """Bytes the process maps outside torch and the KV cache (NCCL's buffers, a library's workspace)."""
        self.unmapped = 0
        """Bytes of torch segments a sleep allocator unmapped: torch still counts them, the device does not."""
        self.neighbour = 0
        """Bytes another process holds on the device."""

    @property
    def process_bytes(self) -> int:
        return self.reserved + self.context + self.mapped + self.other - self.unmapped

    def allocate(self, size: int) -> None:
        """Live tensors of the default pool: its free blocks first, then new segments (a private pool's free blocks
        serve only that pool)."""
        self.allocated += size
        self.reserved = max(self.reserved, self.allocated + self.pool_free)
        self.peak = max(self.peak, self.allocated)

    def free(self, size: int) -> None:
        self.allocated -= size

    def allocate_pool(self, size: int, free: int = 0) -> None:
        """A private pool's segment (CUDA graph capture): reserved for it alone, all but ``free`` bytes live."""
        self.allocated += size - free
        self.reserved += size
        self.pool += size
        self.pool_free += free
        self.peak = max(self.peak, self.allocated + free)

    def empty_cache(self) -> None:
        """The default pool's free segments go back to the device; a private pool keeps its own."""
        self.reserved = self.allocated + self.pool_free

    def memory_allocated(self, device: Any) -> int:
        return self.allocated

    def memory_reserved(self, device: Any) -> int:
        return self.reserved

    def max_memory_allocated(self, device: Any) -> int:
        return self.peak

    def reset_peak_memory_stats(self, device: Any) -> None:
        self.peak = self.allocated

    def mem_get_info(self, device: Any) -> tuple[int, int]:
        return self.total - self.process_bytes - self.neighbour, self.total

    def memory_snapshot(self, include_traces: bool = True) -> list[dict[str, Any]]:
        """torch's segments: the default pool's and the private pools', as ``torch.cuda.memory_snapshot`` lists them."""
        pool_live = self.pool - self.pool_free
        segments = [(0, 0, self.reserved - self.pool, self.allocated - pool_live), (1, 0, self.pool, pool_live)]
        return [
            {"device": 0, "segment_pool_id": (first, second), "total_size": size, "allocated_size": live}
            for first, second, size, live in segments
            if size
        ]

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return "gpu"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=self.process_bytes)]


class SleepAllocator:
    """The books of vLLM's ``CuMemAllocator`` (``pointer_to_data``: per allocation its handle, tag and ``is_asleep``)
    and what its sleep and wake-up do to the device: unmap a tag's pages (torch still counts them) and map them again."""

    instance: SleepAllocator | None = None
    """The process's allocator, where vLLM keeps it (``CuMemAllocator.instance``)."""

    def __init__(self, gpu: Gpu) -> None:
        from vllm.device_allocator import AllocationData

        self.gpu = gpu
        self.record = AllocationData
        self.pointer_to_data: dict[int, Any] = {}

    def allocate(self, tag: str, size: int) -> None:
        """Record an allocation of the pool (the caller moves torch's figures)."""
        self.pointer_to_data[len(self.pointer_to_data) + 1] = self.record(handle=(0, size, 0, 0), tag=tag)

    def sleep(self, offload_tags: tuple[str, ...]) -> None:
        for data in self.pointer_to_data.values():
            if not data.is_asleep:
                data.is_asleep = True
                self.gpu.unmapped += data.handle[1]
        self.gpu.empty_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        for data in self.pointer_to_data.values():
            if data.is_asleep and (tags is None or data.tag in tags or data.tag not in ("weights", "kv_cache")):
                data.is_asleep = False
                self.gpu.unmapped -= data.handle[1]


class StandInKVCache:
    """``ExtensibleKVCache``'s figures and commit rules, mapping pages on a ``Gpu`` outside torch."""

    def __init__(self, gpu: Gpu, capacity_blocks: int, segment_strides: list[int]) -> None:
        self.gpu = gpu
        self.capacity_blocks = capacity_blocks
        self.segment_strides = segment_strides
        self.size = capacity_blocks * sum(segment_strides)
        self.bytes_per_block = sum(segment_strides)
        self.num_committed_blocks = 0
        self.min_committed_blocks = 1
        self._mapped = 0
        self.reserved_headroom_bytes = 0
        self.torch_reserve_growth_bytes = 0

    @property
    def physical_bytes(self) -> int:
        """Mapped bytes, granule rounding included."""
        return self._mapped

    def physical_bytes_for(self, num_blocks: int) -> int:
        """Bytes a commit of ``num_blocks`` maps: each segment's prefix rounded up to granules."""
        return sum(-(-num_blocks * stride // GRANULE) * GRANULE for stride in self.segment_strides)

    def _map(self, num_bytes: int) -> None:
        self.gpu.mapped += num_bytes - self._mapped
        self._mapped = num_bytes

    def allocate(self) -> None:
        """``initialize_kv_cache``'s allocation: the reservation, with the null block committed."""
        self.commit(self.min_committed_blocks)

    def commit(self, num_blocks: int, shrink: bool = False) -> None:
        """Back the first ``num_blocks`` blocks; grow-only unless ``shrink``, which remaps a smaller prefix."""
        num_blocks = min(num_blocks, self.capacity_blocks)
        if shrink and num_blocks < self.num_committed_blocks:
            self.release_physical()
            self.num_committed_blocks = 0
        if num_blocks <= self.num_committed_blocks:
            return
        self._map(self.physical_bytes_for(num_blocks))
        self.num_committed_blocks = num_blocks

    def release_physical(self) -> None:
        """Drop every page (sleep, a weight update borrowing the memory); the block count stays."""
        self._map(0)

    def recommit(self) -> None:
        """Map fresh pages for the blocks committed before the release."""
        num_blocks, self.num_committed_blocks = self.num_committed_blocks, 0
        self.commit(num_blocks)


class StandInRunner:
    """The runner's figures the hook reads: the model, the extensible cache, ``model_memory_usage``, ``capture_model``."""

    def __init__(self, gpu: Gpu, graph_pool: int, graph_pool_free: int = 0) -> None:
        self.gpu = gpu
        self.graph_pool = graph_pool
        self.graph_pool_free = graph_pool_free
        self.model: Any = None
        self.extensible_kv_cache: StandInKVCache | None = None
        self.model_memory_usage = 0
        self.during_capture: list[Any] = []
        """What else happens on the device while the graphs are captured (a neighbour, NCCL), each called once."""
        self.allocator: SleepAllocator | None = None

    def capture_model(self, *, profile_only: bool = False) -> int:
        """Capture the graphs into their private pool; return the drop in the device's free memory, as vLLM does."""
        free_before = self.gpu.mem_get_info(None)[0]
        if not profile_only:
            self.gpu.allocate_pool(self.graph_pool, self.graph_pool_free)
            if self.allocator is not None:
                self.allocator.allocate("cudagraph", self.graph_pool)
            for happen in self.during_capture:
                happen()
        return free_before - self.gpu.mem_get_info(None)[0]


class StandInWorker:
    """vLLM 0.34's ``Worker`` as the engine core drives it, with an extensible KV cache on a ``Gpu``."""

    def __init__(
        self,
        gpu: Gpu,
        weights: int = 4 * GIB,
        activation_peak: int = 2 * GIB,
        graph_pool: int = 300 * MIB,
        graph_pool_free: int = 200 * MIB,
        warm_up_blocks: int = 1000,
        extensible: bool = True,
        device_type: str = "stand-in",
        graph_estimate: int = 0,
        runtime_buffers: int = 200 * MIB,
        sleep_mode: bool = False,
        torch_reserve_growth: int = 0,
    ) -> None:
        self.torch_reserve_growth = torch_reserve_growth
        self.gpu = gpu
        self.runtime_buffers = runtime_buffers
        self.allocator = SleepAllocator(gpu) if sleep_mode else None
        SleepAllocator.instance = self.allocator
        self.weights = weights
        self.activation_peak = activation_peak
        self.graph_pool = graph_pool
        self.warm_up_blocks = warm_up_blocks
        self.graph_estimate = graph_estimate
        self.device = SimpleNamespace(type=device_type, index=0)
        self.local_rank = 0
        self.vllm_config = SimpleNamespace(
            model_config=SimpleNamespace(
                model="/models/tiny", served_model_name="tiny", architectures=["Tiny"], enforce_eager=False
            ),
            scheduler_config=SimpleNamespace(max_num_seqs=8),
            parallel_config=SimpleNamespace(data_parallel_rank=0),
            cache_config=SimpleNamespace(enable_extensible_kv_cache=extensible, num_gpu_blocks=None),
        )
        self.model_runner = StandInRunner(gpu, graph_pool, graph_pool_free)
        self.model_runner.allocator = self.allocator
        self.calls: list[str] = []

    def _pool(self, tag: str, size: int) -> None:
        if self.allocator is not None:
            self.allocator.allocate(tag, size)

    def init_device(self) -> None:
        """The device and the runner's buffers (vLLM 0.34 makes them here, in its sleep pool's ``runtime`` tag)."""
        self.calls.append("init_device")
        self.gpu.allocate(self.runtime_buffers)
        self._pool("runtime", self.runtime_buffers)

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        import torch

        self.calls.append("load_model")
        self.gpu.allocate(self.weights)
        self._pool("weights", self.weights)
        self.model_runner.model = torch.nn.Linear(2, 2)
        self.model_runner.model_memory_usage = self.weights

    def determine_available_memory(self) -> int:
        self.calls.append("determine_available_memory")
        self.gpu.reset_peak_memory_stats(None)
        self.gpu.allocate(self.activation_peak)
        self.gpu.free(self.activation_peak)
        headroom = self.gpu.max_memory_allocated(None) - self.gpu.memory_allocated(None)
        self.cudagraph_memory_estimate = self.graph_estimate
        self.peak_activation_memory = headroom + self.graph_estimate
        return self.gpu.total - self.gpu.process_bytes

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        self.calls.append("initialize_from_config")
        if self.vllm_config.cache_config.enable_extensible_kv_cache:
            cache = StandInKVCache(self.gpu, kv_cache_config.num_blocks, kv_cache_config.segment_strides)
            cache.allocate()
            cache.reserved_headroom_bytes = getattr(self, "peak_activation_memory", 0)
            self.model_runner.extensible_kv_cache = cache
        else:
            size = kv_cache_config.num_blocks * sum(kv_cache_config.segment_strides)
            self.gpu.allocate(size)
            self._pool("kv_cache", size)
            self.vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks

    def compile_or_warm_up_model(self) -> None:
        self.calls.append("compile_or_warm_up_model")
        cache = self.model_runner.extensible_kv_cache
        self.gpu.reset_peak_memory_stats(None)
        if cache is not None:
            cache.commit(self.warm_up_blocks)
        self.gpu.allocate(self.activation_peak)
        self.gpu.free(self.activation_peak)
        if cache is not None:
            cache.commit(cache.min_committed_blocks, shrink=True)
            cache.torch_reserve_growth_bytes = self.torch_reserve_growth
        if not self.vllm_config.model_config.enforce_eager:
            self.model_runner.capture_model()

    def extend_kv_cache(self, num_blocks: int) -> None:
        self.calls.append("extend_kv_cache")
        cache = self.model_runner.extensible_kv_cache
        cache.commit(num_blocks, shrink=True)
        self.vllm_config.cache_config.num_gpu_blocks = num_blocks

    def sleep(self, level: int = 1) -> None:
        self.calls.append("sleep")
        cache = self.model_runner.extensible_kv_cache
        if cache is not None:
            cache.release_physical()
        if self.allocator is not None:
            self.allocator.sleep(("weights", "runtime", "cudagraph"))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append("wake_up")
        if self.allocator is not None:
            self.allocator.wake_up(tags)
        cache = self.model_runner.extensible_kv_cache
        if cache is not None and (tags is None or "kv_cache" in tags):
            cache.recommit()

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def kv_cache_config(num_blocks: int, segment_strides: list[int]) -> SimpleNamespace:
    """The part of a ``KVCacheConfig`` the stand-in reads: the capacity and each segment's block stride."""
    return SimpleNamespace(num_blocks=num_blocks, segment_strides=segment_strides, kv_cache_tensors=[])


def run_engine_core(worker: StandInWorker, config: Any, final_blocks: int) -> None:
    """``EngineCore`` start-up, in 0.34's order: the device, load, profile, reserve, warm up, then the final extend."""
    worker.init_device()
    worker.load_model()
    worker.determine_available_memory()
    worker.initialize_from_config(config)
    worker.compile_or_warm_up_model()
    if worker.vllm_config.cache_config.enable_extensible_kv_cache:
        worker.extend_kv_cache(final_blocks)
