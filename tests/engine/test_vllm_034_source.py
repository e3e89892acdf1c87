"""The hook against vLLM 0.34.0's released source: every method it wraps, and every figure it reads, still as expected.

vLLM 0.34 has no CPU build and needs a CUDA torch, so its worker modules are read from the wheel
(``tests/support/vllm_wheel.py``: ``pip download --no-deps``, cached under build/), not imported.
A renamed method, a changed signature, a figure the extensible KV cache no longer keeps, or an
engine core that extends the cache before warm-up fails here, naming what changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modelkv_exporter.engine.vllm_hook import plugin
from modelkv_exporter.engine.vllm_hook.extensible_kv import figures_of
from tests.support import vllm_wheel

VERSION = "0.34.0"
WORKER = "vllm/v1/worker/gpu_worker.py"
WORKER_BASE = "vllm/v1/worker/worker_base.py"
EXECUTOR = "vllm/v1/executor/abstract.py"
ENGINE_CORE = "vllm/v1/engine/core.py"
CACHE = "vllm/v1/worker/extensible_kv_cache.py"
RUNNER = "vllm/v1/worker/gpu/model_runner.py"

EXPECTED = {
    "init_device": "self",
    "load_model": "self, *, load_dummy_weights: bool=False",
    "initialize_from_config": "self, kv_cache_config: KVCacheConfig",
    "compile_or_warm_up_model": "self",
    "extend_kv_cache": "self, num_blocks: int",
    "determine_available_memory": "self",
    "sleep": "self, level: int=1",
    "wake_up": "self, tags: list[str] | None=None",
    "discard": "self, tags: tuple[str, ...]",
    "shutdown": "self",
    "execute_model": "self, scheduler_output: 'SchedulerOutput'",
    "sample_tokens": "self, grammar_output: 'GrammarOutput | None'",
}
"""Each method the hook wraps on vLLM's ``Worker``, with the parameters its step relies on."""
FIGURES = ("physical_bytes", "num_committed_blocks", "size", "capacity_blocks")
"""What ``extensible_kv.figures_of`` reads from an ``ExtensibleKVCache``."""


@pytest.fixture(scope="module")
def wheel() -> Path:
    return vllm_wheel.wheel(VERSION)


def differences(worker_source: str) -> list[str]:
    """How the ``Worker`` in ``worker_source`` differs from what the hook's plan expects (empty: nothing)."""
    found = vllm_wheel.methods(worker_source, "Worker")
    problems = []
    for method in plugin.worker_plan():
        expected = EXPECTED.get(method.name)
        if expected is None:
            problems.append(f"the hook wraps {method.name}, which this test does not know")
        elif method.name not in found:
            problems.append(f"Worker.{method.name} is gone")
        elif found[method.name].parameters != expected:
            problems.append(f"Worker.{method.name}({found[method.name].parameters}), the hook expects ({expected})")
    return problems


def test_every_method_the_hook_wraps_has_the_signature_it_expects(wheel: Path) -> None:
    assert differences(vllm_wheel.source(wheel, WORKER)) == []


def test_a_renamed_or_changed_method_is_reported(wheel: Path) -> None:
    """The check broken on purpose: the same source with ``extend_kv_cache`` renamed and a parameter added."""
    text = vllm_wheel.source(wheel, WORKER)
    renamed = text.replace("def extend_kv_cache(self, num_blocks: int)", "def grow_kv_cache(self, num_blocks: int)")
    assert differences(renamed) == ["Worker.extend_kv_cache is gone"]
    changed = text.replace("def initialize_from_config(self, kv_cache_config", "def initialize_from_config(self, cfg")
    assert differences(changed) == [
        "Worker.initialize_from_config(self, cfg: KVCacheConfig), the hook expects (self, kv_cache_config: KVCacheConfig)"
    ]


def test_every_executor_reaches_the_worker_method(wheel: Path) -> None:
    """The executor's ``extend_kv_cache`` is a collective RPC to the workers' method, through the wrapper."""
    assert vllm_wheel.methods(vllm_wheel.source(wheel, EXECUTOR), "Executor")["extend_kv_cache"].parameters == (
        "self, num_blocks: int"
    )
    assert 'self.collective_rpc("extend_kv_cache", args=(num_blocks,))' in vllm_wheel.source(wheel, EXECUTOR)
    wrapper = vllm_wheel.source(wheel, WORKER_BASE)
    assert "extend_kv_cache" in vllm_wheel.methods(wrapper, "WorkerWrapperBase")
    assert "init_worker" in vllm_wheel.methods(wrapper, "WorkerWrapperBase")
    assert "self.worker.extend_kv_cache(num_blocks)" in wrapper


def test_the_engine_core_extends_the_cache_after_warm_up(wheel: Path) -> None:
    """The order the baseline move relies on: reserve, warm up, then the final commit."""
    order = vllm_wheel.calls_in_order(
        vllm_wheel.source(wheel, ENGINE_CORE),
        "EngineCore",
        "_initialize_kv_caches",
        ("initialize_from_config", "compile_or_warm_up_model", "extend_kv_cache"),
    )
    assert order == ["initialize_from_config", "compile_or_warm_up_model", "extend_kv_cache"]


def test_the_cache_keeps_the_figures_the_hook_reads_and_the_runner_holds_it(wheel: Path) -> None:
    text = vllm_wheel.source(wheel, CACHE)
    methods = vllm_wheel.methods(text, "ExtensibleKVCache")
    assigned = vllm_wheel.attributes_set(text, "ExtensibleKVCache")
    for name in FIGURES:
        assert name in assigned or methods.get(name, vllm_wheel.Signature("")).is_property, name
    assert {"release_physical", "recommit", "commit"} <= set(methods)
    assert "extensible_kv_cache" in vllm_wheel.attributes_set(vllm_wheel.source(wheel, RUNNER), "GPUModelRunner")
    worker = vllm_wheel.source(wheel, WORKER)
    assert 'getattr(self.model_runner, "extensible_kv_cache", None)' in worker


def test_the_figures_read_are_the_ones_named_here() -> None:
    class Cache:
        def __init__(self) -> None:
            for value, name in enumerate(FIGURES, 1):
                setattr(self, name, value)

    figures = figures_of(Cache())
    assert figures is not None and (figures.committed_bytes, figures.reserved_blocks) == (1, 4)


def test_the_sleep_allocator_keeps_the_books_the_hook_reads(wheel: Path) -> None:
    """``engine/vllm_hook/sleep.py`` reads ``CuMemAllocator.instance.pointer_to_data``'s ``handle[1]``, ``tag`` and
    ``is_asleep``; vLLM 0.34's CuMem backend unmaps the graph pools (``cudagraph``) and runtime buffers too."""
    allocator = vllm_wheel.source(wheel, "vllm/device_allocator/cumem.py")
    assert 'instance: "CuMemAllocator | None" = None' in allocator or "instance = None" in allocator
    assert "pointer_to_data" in vllm_wheel.attributes_set(allocator, "CuMemAllocator")
    records = vllm_wheel.source(wheel, "vllm/device_allocator/__init__.py")
    assert "handle: HandleType" in records and "tag: str" in records and "is_asleep: bool = False" in records
    backend = vllm_wheel.source(wheel, "vllm/device_allocator/sleep_mode_backend.py")
    assert '("weights", "runtime", "cudagraph"), discardable' in backend


def test_the_extensible_cache_keeps_what_vllm_keeps_free_for_torch(wheel: Path) -> None:
    assigned = vllm_wheel.attributes_set(vllm_wheel.source(wheel, CACHE), "ExtensibleKVCache")
    assert {"reserved_headroom_bytes", "torch_reserve_growth_bytes"} <= assigned
