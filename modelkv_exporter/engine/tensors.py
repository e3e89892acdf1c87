"""Weighing a tensor by the storages behind it, running none of the model's code.

The one weigher of the engine side: a model's weights (``engine.weights``), the census (``engine.discover``) and
the cache layers the observer measures (``engine.observe.layers``) all read bytes here.

A tensor subclass may run Python for what looks like a plain read: ``__torch_function__`` for any method or
property called on it, and ``__torch_dispatch__`` for its sizes, strides, device and layout when it was made with
``dispatch_sizes_strides_policy``, ``dispatch_device`` or ``dispatch_layout`` (``nbytes``, ``numel()``,
``data_ptr()``, ``dim()``, ``device``, ``layout`` and ``is_meta`` all reach it). None of those are read. With
``__torch_function__`` off (``torch._C.DisableTorchFunction``, which also turns off the modes), these reach no
Python, whatever the subclass (checked against a subclass counting its dispatch calls, torch 2.13):

- ``torch._C.TensorBase.untyped_storage`` called unbound, and the storage's ``nbytes()``, ``data_ptr()`` and
  ``device``: a tensor's bytes are its storage's ``nbytes``, keyed by ``(device, data pointer)`` so views of one
  buffer count once;
- the dispatch key set (``torch._C._dispatch_keys``): whether a tensor without a storage dispatches to Python at
  all; only one that does not (or a plain ``torch.Tensor``) has its ``layout`` read, to find its sparse parts;
- the instance's attributes, through ``torch.Tensor``'s real ``__dict__`` descriptor and the ``__slots__``
  member descriptors of its class (never a property of the subclass).

A meta tensor weighs nothing (no memory behind it). A sparse tensor weighs its indices and values, read with
Python dispatch off (``torch._C._DisableTorchDispatch``: no dispatch mode sees the read). A wrapper subclass (DTensor,
FP8 and torchao tensors, a jagged ``NestedTensor``: made with ``_make_wrapper_subclass``, no storage of its own)
keeps its data in inner tensors that torch's ``__tensor_flatten__`` protocol names as its attributes; calling
``__tensor_flatten__`` would run the subclass's code, so the inner tensors are found among its attributes instead:
every tensor directly in its instance dict or slots, weighed the same way (a wrapper of wrappers down to
``MAX_DEPTH``). A tensor whose bytes cannot be read this way is unknown: ``weigh`` says so, and adds nothing.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

StorageKey = tuple[str, int]
"""``(device, data pointer)`` of a storage (an empty one, which has no pointer, keyed by minus its tensor's ``id``)."""

MAX_DEPTH = 4
"""How many wrappers deep inner tensors are looked for."""

TENSOR_BASE = torch._C.TensorBase
TENSOR_DICT = torch.Tensor.__dict__["__dict__"]
"""The real instance dict of every tensor subclass, whatever a subclass defines as ``__dict__``."""
_TYPE_MRO = type.__dict__["__mro__"]
_TYPE_DICT = type.__dict__["__dict__"]
_Tensor = torch.Tensor
_modes_on = torch._C._is_torch_function_mode_enabled
_untyped_storage = TENSOR_BASE.untyped_storage
_layout_of: Callable[[Any], Any] = vars(TENSOR_BASE)["layout"].__get__
_no_torch_function = torch._C.DisableTorchFunction
_no_python_dispatch = torch._C._DisableTorchDispatch
_dispatch_keys = torch._C._dispatch_keys
_PYTHON = torch._C.DispatchKey.Python
_STRIDED = torch.strided
SPARSE_PARTS: dict[Any, tuple[Callable[[Any], Any], ...]] = {
    torch.sparse_coo: (TENSOR_BASE._indices, TENSOR_BASE._values),
    torch.sparse_csr: (TENSOR_BASE.crow_indices, TENSOR_BASE.col_indices, TENSOR_BASE.values),
    torch.sparse_csc: (TENSOR_BASE.ccol_indices, TENSOR_BASE.row_indices, TENSOR_BASE.values),
    torch.sparse_bsr: (TENSOR_BASE.crow_indices, TENSOR_BASE.col_indices, TENSOR_BASE.values),
    torch.sparse_bsc: (TENSOR_BASE.ccol_indices, TENSOR_BASE.row_indices, TENSOR_BASE.values),
}
"""The parts of a sparse tensor, by layout: torch's own getters."""

_slots: dict[type, tuple[Any, ...]] = {}
_device_names: dict[torch.device, str] = {}


def is_tensor(value: object) -> bool:
    """Whether ``value`` is a tensor, by its real type (``isinstance`` may read a ``__class__`` property)."""
    return issubclass(type(value), torch.Tensor)


def weigh(tensor: Any, out: dict[StorageKey, int], *, empty: bool = False) -> bool:
    """Add the storages behind ``tensor`` to ``out`` (``{(device, data pointer): nbytes}``); False when its bytes
    cannot be read without running the model's code (then nothing of it is added). Raises nothing.

    A storage that holds no bytes (a meta tensor's, an empty tensor's) is left out; with ``empty``, it is added at 0
    (keyed by its tensor's ``id``): where a tensor lies, even where it weighs nothing."""
    try:
        if type(tensor) is _Tensor and not _modes_on():
            if _layout_of(tensor) is not _STRIDED:
                return _sparse(tensor, out, 0, empty)
            return _weigh(tensor, out, 0, empty)
        if not is_tensor(tensor):
            return False
        found: dict[StorageKey, int] = {}
        with _no_torch_function():
            known = _weigh(tensor, found, 0, empty)
    except Exception:
        return False
    if known:
        out.update(found)
    return known


def dispatches_to_python(tensor: Any) -> bool:
    """Whether reading ``tensor``'s sizes, device or layout may run Python (a subclass or a mode's
    ``__torch_dispatch__``), from its dispatch keys; True for anything that is not a tensor."""
    if not is_tensor(tensor):
        return True
    try:
        return _dispatch_keys(tensor).has(_PYTHON)  # type: ignore[no-any-return]
    except Exception:
        return True


def tensor_dict(tensor: Any) -> dict[str, Any] | None:
    """A tensor subclass instance's own attribute dict (a wrapper's inner tensors), never through a property."""
    try:
        found = TENSOR_DICT.__get__(tensor, type(tensor))
    except Exception:
        return None
    return found if issubclass(type(found), dict) else None


def inner_tensors(tensor: Any) -> list[Any]:
    """The tensors directly in a tensor subclass instance's attributes: its instance dict and its ``__slots__``."""
    held = tensor_dict(tensor)
    found = [] if held is None else [value for value in dict.values(held) if is_tensor(value)]
    cls = type(tensor)
    for slot in _slot_descriptors(cls):
        try:
            value = slot.__get__(tensor, cls)
        except Exception:
            continue
        if is_tensor(value):
            found.append(value)
    return found


def _slot_descriptors(cls: type) -> tuple[Any, ...]:
    known = _slots.get(cls)
    if known is None:
        chain = _TYPE_MRO.__get__(cls)
        known = _slots[cls] = tuple(
            value
            for klass in chain
            if klass not in (torch.Tensor, TENSOR_BASE, object)
            for value in _TYPE_DICT.__get__(klass).values()
            if type(value) is types.MemberDescriptorType
        )
    return known


def _weigh(tensor: Any, out: dict[StorageKey, int], depth: int, empty: bool) -> bool:
    """``weigh`` with ``__torch_function__`` already off; raises what torch raises for a storage it cannot show."""
    try:
        storage = _untyped_storage(tensor)
        size = storage.nbytes()
        device = storage.device
        pointer = storage.data_ptr()
    except Exception:
        return _without_storage(tensor, out, depth, empty)
    name = _device_names.get(device)
    if name is None:
        name = _device_names[device] = str(device)
    if name == "meta":
        size = 0
    if size or empty:
        out[(name, pointer if pointer and size else -id(tensor))] = size
    return True


def _without_storage(tensor: Any, out: dict[StorageKey, int], depth: int, empty: bool) -> bool:
    if not _dispatch_keys(tensor).has(_PYTHON):
        return _sparse(tensor, out, depth, empty)
    if depth >= MAX_DEPTH:
        return False
    inner = inner_tensors(tensor)
    return bool(inner) and all(_weigh(part, out, depth + 1, empty) for part in inner)


def _sparse(tensor: Any, out: dict[StorageKey, int], depth: int, empty: bool) -> bool:
    """A tensor that dispatches nothing to Python: its layout's parts (False for a layout that has none here)."""
    with _no_python_dispatch():
        parts = tuple(getter(tensor) for getter in SPARSE_PARTS.get(_layout_of(tensor), ()))
    return bool(parts) and all(_weigh(part, out, depth, empty) for part in parts)
