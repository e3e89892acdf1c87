"""The bytes tensors hold, each storage once: a model's weights (parameters and buffers) and any list of tensors.

For an engine that keeps no figure of its own (vLLM's runners keep ``model_memory_usage``): the demo
engines, a CPU worker, any engine that publishes with ``build_snapshot``; and for the paged KV cache's
tensors (``engine.vllm_hook.paged_kv``). Walked once, after the model loaded; no tensor is kept. None of
the model's code runs: the module tree is read through ``nn.Module``'s real ``__dict__`` (not a subclass's
``parameters()``), and storages through ``torch._C.TensorBase`` with ``__torch_function__`` turned off.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from modelkv_exporter.engine.modules import MODULE_DICT, walk_modules

_TensorBase = torch._C.TensorBase
_device_of = vars(_TensorBase)["device"].__get__


def storage_bytes(tensors: Iterable[Any]) -> int | None:
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count once); None for no tensor."""
    storages: dict[tuple[str, int], int] = {}
    with torch._C.DisableTorchFunction():
        for tensor in tensors:
            storage = _TensorBase.untyped_storage(tensor)
            storages[(str(_device_of(tensor)), int(storage.data_ptr()))] = int(storage.nbytes())
    return sum(storages.values()) if storages else None


def _weights(model: torch.nn.Module) -> Iterator[Any]:
    for _, module in walk_modules(model):
        state = MODULE_DICT.__get__(module, type(module))
        for name in ("_parameters", "_buffers"):
            held = state.get(name)
            if type(held) is dict:
                yield from (t for t in held.values() if issubclass(type(t), torch.Tensor))


def model_weight_bytes(model: Any) -> int | None:
    """Bytes of ``model``'s parameters and buffers, views of one storage counted once; None when not a module or
    when a tensor's storage cannot be read."""
    if not issubclass(type(model), torch.nn.Module):
        return None
    try:
        return storage_bytes(_weights(model)) or 0
    except Exception:
        return None
