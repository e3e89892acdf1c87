"""The bytes tensors hold on the engine's device, each storage once: a model's weights and any list of tensors.

For an engine that keeps no figure of its own (vLLM's runners keep ``model_memory_usage``): the demo
engines, a CPU worker, any engine that publishes with ``build_snapshot``; and for the paged KV cache's
tensors (``engine.vllm_hook.paged_kv``). Walked once, after the model loaded; no tensor is kept. None of
the model's code runs: the module tree is read through ``nn.Module``'s real ``__dict__`` (not a subclass's
``parameters()``), with ``dict``'s own methods (never those of a dict subclass put in its place), and storages by
the engine's weigher (``engine.tensors``: no ``__torch_function__``, no ``__torch_dispatch__``; a wrapper subclass,
such as an FP8 or torchao weight, through its inner tensors). A tensor whose bytes cannot be read that way makes
the figure unknown (None).

What counts: tensors on the device named (a CUDA worker's ``cuda:N``; a host engine's ``cpu``), never a
``meta`` tensor (no memory behind it). A model's weights are its parameters, its buffers and its computed
weights (``engine.module_walk.computed_weights``: what a legacy ``weight_norm`` or ``spectral_norm`` rewrites at
every forward, held between forwards like any weight).

Weights vLLM offloads to the host (``--cpu-offload-gb``: ``UVAOffloader`` in vLLM 0.30 and 0.32) are left out: without UVA
a parameter becomes a plain CPU tensor (on another device than the worker's); with UVA it becomes a CUDA view of
pinned host memory, whose device is the worker's, told apart only by the flag vLLM sets on the parameter
(``_vllm_is_uva_offloaded``). Another engine's UVA view of host memory cannot be told from device memory and is
counted. The prefetch offloader's parameters point at its device buffers, shared by layers: counted once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from modelkv_exporter.engine.module_walk import MODULE_DICT, computed_weights, walk_modules
from modelkv_exporter.engine.tensors import StorageKey, is_tensor, weigh

_tensor_dict = torch.Tensor.__dict__["__dict__"].__get__
_get = dict.get
UVA_OFFLOADED = "_vllm_is_uva_offloaded"
"""The flag vLLM's ``UVAOffloader`` sets on a parameter whose data it moved to host memory behind a CUDA view."""

Device = torch.device | str | None
"""The engine's device (``torch.device`` or its spelling); None, or anything else: every device (meta never counts)."""


def _wanted(device: object) -> torch.device | None:
    """``device`` as a ``torch.device``; None (every device) for anything else, such as a worker without one."""
    if type(device) is torch.device:
        return device
    return torch.device(device) if type(device) is str else None


def _on(found: torch.device, wanted: torch.device | None) -> bool:
    """Whether a tensor on ``found`` holds memory on ``wanted`` (a device without an index: any of its type)."""
    if found.type == "meta":
        return False
    if wanted is None:
        return True
    return found.type == wanted.type and (wanted.index is None or found.index == wanted.index)


def storage_bytes(tensors: Iterable[Any], device: Device = None) -> int | None:
    """Bytes of the distinct storages behind ``tensors`` on ``device`` (every device when None; views of one buffer
    count once; a ``meta`` tensor never counts); None when no storage counts, or when a tensor cannot be weighed."""
    held = _held(tensors, device)
    return None if held is None else held[0] if held[1] else None


def _held(tensors: Iterable[Any], device: Device) -> tuple[int, bool] | None:
    """The bytes ``storage_bytes`` counts and whether any storage counted; None when a tensor cannot be weighed."""
    wanted = _wanted(device)
    storages: dict[StorageKey, int] = {}
    for tensor in tensors:
        if not weigh(tensor, storages):
            return None
    devices: dict[str, bool] = {}
    held = 0
    for (where, _), size in storages.items():
        on = devices.get(where)
        if on is None:
            on = devices[where] = _on(torch.device(where), wanted)
        if on:
            held += size
    return held, any(devices.values())


def _host_offloaded(tensor: Any) -> bool:
    held = _tensor_dict(tensor, type(tensor))
    return type(held) is dict and _get(held, UVA_OFFLOADED) is True


def _weights(model: torch.nn.Module) -> Iterator[Any]:
    for _, module in walk_modules(model):
        state = MODULE_DICT.__get__(module, type(module))
        for name in ("_parameters", "_buffers"):
            held = _get(state, name)
            if type(held) is dict:
                yield from (t for t in dict.values(held) if is_tensor(t) and not _host_offloaded(t))
        for name in computed_weights(state):
            computed = _get(state, name)
            if is_tensor(computed):
                yield computed


def model_weight_bytes(model: Any, device: Device = None, also: Iterable[Any] = ()) -> int | None:
    """Bytes of ``model``'s parameters, buffers and computed weights on ``device`` (every device when None; never
    ``meta``, never a parameter vLLM offloaded to the host), and of the tensors ``also`` names (weights a backend
    keeps where no module does), each storage once; None when not a module or when a tensor's storage cannot be
    read."""
    if not issubclass(type(model), torch.nn.Module):
        return None
    try:
        held = _held(itertools.chain(_weights(model), also), device)
    except Exception:
        return None
    return None if held is None else held[0]
