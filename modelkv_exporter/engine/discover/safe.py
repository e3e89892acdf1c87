"""Reading what an object holds without running any of its code.

Nothing here calls a property, ``__getattr__``, ``__getattribute__``, ``__class__``, ``__instancecheck__``,
``__iter__``, ``__getitem__``, ``__hash__`` or ``__torch_function__`` of the objects it reads:

- what an object is, is decided from ``type(obj)`` (a C slot) and the type's MRO read through ``type``'s own
  descriptor, once per type (``kind``);
- containers are read through the C methods of their built-in base (``list.__getitem__``, ``dict.values``);
- an object's attributes through the real ``__dict__`` descriptor of the class that made its dict, and the
  member descriptors of its ``__slots__`` (``getters``);
- a tensor's storages by the engine's one weigher (``engine.tensors``: ``weigh`` and ``tensor_dict`` are its, named
  here for the census): no ``__torch_function__``, no ``__torch_dispatch__``; a wrapper subclass through its inner
  tensors, or unknown.
"""

from __future__ import annotations

import collections
import enum
import functools
import gc
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from modelkv_exporter.engine.tensors import TENSOR_BASE
from modelkv_exporter.engine.tensors import tensor_dict as tensor_dict
from modelkv_exporter.engine.tensors import weigh as weigh

TYPE_DICT = type.__dict__["__dict__"]
TYPE_MRO = type.__dict__["__mro__"]


class Kind(enum.IntEnum):
    """How the census reads an object of a type."""

    ATOMIC = 0
    """Holds no tensor."""
    SKIP = 1
    """Not looked into: code, classes, modules (each module is visited on its own), weak references."""
    TENSOR = 2
    LIST = 3
    TUPLE = 4
    DICT = 5
    ITERABLE = 6
    """Deques and sets: read through their built-in iterator."""
    OBJECT = 7
    """Anything else: its ``__dict__`` and ``__slots__``."""


ATOMIC_TYPES: frozenset[type] = frozenset(
    {int, float, bool, str, bytes, bytearray, complex, type(None), torch.dtype, torch.device, torch.Size, range, slice}
)
SKIPPED_TYPES: frozenset[type] = frozenset(
    {
        type,
        types.FunctionType,
        types.MethodType,
        types.BuiltinFunctionType,
        types.BuiltinMethodType,
        types.ModuleType,
        types.CodeType,
        types.FrameType,
        types.GeneratorType,
        types.CoroutineType,
        types.MappingProxyType,
        functools.partial,
        weakref.ReferenceType,
        weakref.ProxyType,
        weakref.CallableProxyType,
        torch.nn.Module,
        torch.UntypedStorage,
        torch.TypedStorage,
    }
)
ITERABLE_BASES: dict[type, Callable[[Any], Any]] = {
    collections.deque: collections.deque.__iter__,
    set: set.__iter__,
    frozenset: frozenset.__iter__,
}

_kinds: dict[type, Kind] = {}
_getters: dict[type, tuple[Any, tuple[Any, ...]]] = {}


def mro(cls: type) -> tuple[type, ...]:
    """``cls.__mro__``, read through ``type``'s own descriptor (a metaclass cannot override it)."""
    return TYPE_MRO.__get__(cls)  # type: ignore[no-any-return]


def class_dict(cls: type) -> Any:
    """``cls.__dict__``, read through ``type``'s own descriptor."""
    return TYPE_DICT.__get__(cls)


def kind(cls: type) -> Kind:
    """How objects of ``cls`` are read, decided once per type."""
    known = _kinds.get(cls)
    if known is None:
        known = _kinds[cls] = _decide(cls)
    return known


def _decide(cls: type) -> Kind:
    chain = mro(cls)
    bases = set(chain)
    if bases & ATOMIC_TYPES:
        return Kind.ATOMIC
    if TENSOR_BASE in bases:
        return Kind.TENSOR
    if bases & SKIPPED_TYPES:
        return Kind.SKIP
    if list in bases:
        return Kind.LIST
    if tuple in bases:
        return Kind.TUPLE
    if dict in bases:
        return Kind.DICT
    if bases & ITERABLE_BASES.keys():
        return Kind.ITERABLE
    return Kind.OBJECT


def iterate(obj: Any) -> Any:
    """An iterator over a deque or set, through the built-in base's own ``__iter__``."""
    for base in mro(type(obj)):
        method = ITERABLE_BASES.get(base)
        if method is not None:
            return method(obj)
    return iter(())


def getters(cls: type) -> tuple[Any, tuple[Any, ...]]:
    """The real ``__dict__`` descriptor of ``cls``'s instances (None: they have no dict) and its slot descriptors."""
    known = _getters.get(cls)
    if known is not None:
        return known
    dict_getter = None
    slots: list[Any] = []
    for klass in reversed(mro(cls)):
        own = class_dict(klass)
        candidate = own.get("__dict__")
        if dict_getter is None and type(candidate) is types.GetSetDescriptorType:
            dict_getter = candidate
        if klass is not object:
            slots.extend(value for value in own.values() if type(value) is types.MemberDescriptorType)
    known = _getters[cls] = (dict_getter, tuple(slots))
    return known


def instance_dict(obj: Any) -> dict[str, Any] | None:
    """``obj``'s own attribute dict, never through a ``__dict__`` property (None: it has none, or its class hides it)."""
    dict_getter, _ = getters(type(obj))
    if dict_getter is None:
        return None
    try:
        found = dict_getter.__get__(obj, type(obj))
    except Exception:
        return None
    return found if type(found) is dict else None


def slot_values(obj: Any) -> tuple[Any, ...]:
    """The values of ``obj``'s ``__slots__`` that are set; where its class hides its ``__dict__`` behind a property of its
    own, everything the object refers to (``gc.get_referents``: the collector's C traversal, which runs no Python)."""
    dict_getter, slots = getters(type(obj))
    if dict_getter is None and "__dict__" in _hidden_dict(type(obj)):
        return tuple(gc.get_referents(obj))
    values = []
    for slot in slots:
        try:
            values.append(slot.__get__(obj, type(obj)))
        except Exception:
            continue
    return tuple(values)


def _hidden_dict(cls: type) -> dict[str, Any]:
    """The class-level ``__dict__`` entries of ``cls``'s MRO that are not the real descriptor (a property, say)."""
    return {"__dict__": True} if any("__dict__" in class_dict(klass) for klass in mro(cls)[:-1]) else {}
