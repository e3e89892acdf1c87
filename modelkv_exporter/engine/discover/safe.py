"""Reading what an object holds without running any of its code.

Nothing here calls a property, ``__getattr__``, ``__getattribute__``, ``__class__``, ``__instancecheck__``,
``__iter__``, ``__getitem__``, ``__hash__`` or ``__torch_function__`` of the objects it reads:

- what an object is, is decided from ``type(obj)`` (a C slot) and the type's MRO read through ``type``'s own
  descriptor, once per type (``kind``);
- containers are read through the C methods of their built-in base (``list.__getitem__``, ``dict.values``);
- an object's attributes through the real ``__dict__`` descriptor of the class that made its dict, and the
  member descriptors of its ``__slots__`` (``getters``);
- a tensor's storages are weighed by the engine's one weigher (``engine.tensors``), not here.
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
    CALLABLE = 8
    """Functions (closure cells, default arguments, attributes), bound methods (their object and function) and
    ``functools.partial`` (function, arguments, keywords): read through their C descriptors (``callable_parts``)."""


ATOMIC_TYPES: frozenset[type] = frozenset(
    {int, float, bool, str, bytes, bytearray, complex, type(None), torch.dtype, torch.device, torch.Size, range, slice}
)
SKIPPED_TYPES: frozenset[type] = frozenset(
    {
        type,
        types.ModuleType,
        types.CodeType,
        types.FrameType,
        types.GeneratorType,
        types.CoroutineType,
        types.MappingProxyType,
        weakref.ReferenceType,
        weakref.ProxyType,
        weakref.CallableProxyType,
        torch.nn.Module,
        torch.UntypedStorage,
        torch.TypedStorage,
    }
)
CALLABLE_TYPES: frozenset[type] = frozenset(
    {types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial}
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
    if bases & CALLABLE_TYPES:
        return Kind.CALLABLE
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


_FUNCTION_CLOSURE = types.FunctionType.__dict__["__closure__"]
_FUNCTION_DEFAULTS = types.FunctionType.__dict__["__defaults__"]
_FUNCTION_KWDEFAULTS = types.FunctionType.__dict__["__kwdefaults__"]
_FUNCTION_DICT = types.FunctionType.__dict__["__dict__"]
_CELL_CONTENTS = types.CellType.__dict__["cell_contents"]
_METHOD_SELF = types.MethodType.__dict__["__self__"]
_METHOD_FUNCTION = types.MethodType.__dict__["__func__"]
_BUILTIN_SELF = types.BuiltinFunctionType.__dict__["__self__"]
_PARTIAL_PARTS = tuple(functools.partial.__dict__[name] for name in ("func", "args", "keywords"))
_PARTIAL_DICT = functools.partial.__dict__["__dict__"]
_EXCEPTION_ARGS = BaseException.__dict__["args"]


def callable_parts(obj: Any) -> tuple[Any, ...]:
    """What a ``Kind.CALLABLE`` holds, read through the C descriptors of its built-in type (never a subclass's
    attribute): a function's closure cells' contents, its default arguments and its ``__dict__``; a bound method's
    object and function; a builtin method's object; a ``functools.partial``'s function, arguments, keywords and
    ``__dict__``. Raises nothing."""
    try:
        chain = mro(type(obj))
        if types.FunctionType in chain:
            parts: list[Any] = []
            for cell in _FUNCTION_CLOSURE.__get__(obj) or ():
                try:
                    parts.append(_CELL_CONTENTS.__get__(cell))
                except ValueError:
                    continue
            parts += (_FUNCTION_DEFAULTS.__get__(obj), _FUNCTION_KWDEFAULTS.__get__(obj), _FUNCTION_DICT.__get__(obj))
            return tuple(parts)
        if types.MethodType in chain:
            return (_METHOD_SELF.__get__(obj), _METHOD_FUNCTION.__get__(obj))
        if types.BuiltinFunctionType in chain:
            return (_BUILTIN_SELF.__get__(obj),)
        if functools.partial in chain:
            return (*(part.__get__(obj) for part in _PARTIAL_PARTS), _PARTIAL_DICT.__get__(obj))
    except Exception:
        return ()
    return ()


def exception_args(obj: Any) -> tuple[Any, ...]:
    """An exception's ``args``, through ``BaseException``'s own descriptor; empty when it cannot be read."""
    try:
        found = _EXCEPTION_ARGS.__get__(obj)
    except Exception:
        return ()
    return found if type(found) is tuple else ()


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
    """``obj``'s own attribute dict, never through a ``__dict__`` property (None: it has none, its class hides it, or
    it is a dict subclass)."""
    found = raw_instance_dict(obj)
    return found if type(found) is dict else None


def raw_instance_dict(obj: Any) -> dict[str, Any] | None:
    """``obj``'s own attribute dict, never through a ``__dict__`` property, a dict subclass included: read it only
    through ``dict``'s own methods (``dict.items(d)``), never its class's."""
    dict_getter, _ = getters(type(obj))
    if dict_getter is None:
        return None
    try:
        found = dict_getter.__get__(obj, type(obj))
    except Exception:
        return None
    return found if dict in mro(type(found)) else None


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
