"""The model's modules by path, and the code that names one of them on the call stack.

``ModuleMap`` is built once, after load: every module of the model with its path (``""`` = the
root), held weakly, and ``codes``: every code object of the methods the model's module classes
define (nested functions and comprehensions included, ``functools.wraps`` wrappers followed to the
function they wrap), mapped to the one module whose class runs it, where only one module of the
model has that class. Code shared by several modules (a decoder layer's, an attention's, or
``nn.Module``'s own) names none. A frame of the model's code is matched by its ``f_code`` alone:
attribution reads no such frame's locals (on CPython 3.11 reading ``f_locals`` stores a snapshot on
the frame, keeping every tensor the frame deletes later alive until it returns). Where several
models in one process run the same code, ``stack`` tells them apart by the nearest ``nn.Module``
call's frame, which holds nothing but that call's arguments.
"""

from __future__ import annotations

import os
import sys
import types
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from modelkv_exporter.engine.discover import safe
from modelkv_exporter.engine.module_walk import walk_modules

MAX_FRAMES = 64
"""Frames attribution looks through at most, whatever the depth of the caller's stack."""
CACHE_SLOTS = frozenset({"past_key_values", "past_key_value"})
"""Parameter names through which ``transformers`` modules are handed a cache, or an empty slot they fill with a
cache they build and return: such a module only passes the cache along, and the walk goes on outward."""
TRANSFORMERS_CACHE_SLOTS = CACHE_SLOTS | {"cache"}
"""The same in code of ``transformers`` itself: its models take the cache as ``cache`` in 5.25 (5.19 still named it
``past_key_values``, now a deprecated keyword). Elsewhere ``cache`` is too common a name to mean that."""

ModuleEntry = tuple[str, "weakref.ReferenceType[torch.nn.Module]"]


def _function_codes(value: Any) -> Iterator[types.CodeType]:
    """The code objects behind one entry of a class's dict, without running anything of it."""
    kind = type(value)
    if kind in (staticmethod, classmethod):
        value = value.__func__
    elif kind is property:
        for part in (value.fget, value.fset, value.fdel):
            yield from _function_codes(part)
        return
    seen = 0
    while type(value) is types.FunctionType and seen < 16:
        yield from _nested(value.__code__)
        value = value.__dict__.get("__wrapped__")
        seen += 1


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for constant in code.co_consts:
        if type(constant) is types.CodeType:
            yield from _nested(constant)


def class_codes(cls: type) -> set[types.CodeType]:
    """Every code object a method of ``cls`` (or of a base below ``nn.Module``) may run."""
    found: set[types.CodeType] = set()
    for klass in safe.mro(cls):
        if klass is torch.nn.Module or klass is object:
            continue
        for value in list(safe.class_dict(klass).values()):
            found.update(_function_codes(value))
    return found


def cache_slots(code: types.CodeType) -> frozenset[str]:
    """The parameter names that hand code a cache: ``TRANSFORMERS_CACHE_SLOTS`` in ``transformers``' own files
    (found from its imported package, never importing it), else ``CACHE_SLOTS``."""
    package = getattr(sys.modules.get("transformers"), "__file__", None)
    if isinstance(package, str) and code.co_filename.startswith(os.path.dirname(package) + os.sep):
        return TRANSFORMERS_CACHE_SLOTS
    return CACHE_SLOTS


def takes_cache(code: types.CodeType) -> bool:
    """Whether a function with ``code`` has a cache parameter (``cache_slots``)."""
    count = code.co_argcount + code.co_kwonlyargcount
    return not cache_slots(code).isdisjoint(code.co_varnames[:count])


class ModuleMap:
    """Every module of one model: path by ``id``, checked against a weak reference (ids are reused)."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.modules: list[ModuleEntry] = []
        self._by_id: dict[int, ModuleEntry] = {}
        by_class: dict[type, list[ModuleEntry]] = {}
        for path, module in walk_modules(root):
            entry = (path, weakref.ref(module))
            self.modules.append(entry)
            self._by_id[id(module)] = entry
            by_class.setdefault(type(module), []).append(entry)
        runners: dict[types.CodeType, list[ModuleEntry]] = {}
        for cls, entries in by_class.items():
            for code in class_codes(cls):
                runners.setdefault(code, []).extend(entries)
        self._code_objects = list(runners)
        """Kept alive, so that their ids stay theirs."""
        self.codes: dict[int, ModuleEntry] = {
            id(code): entries[0] for code, entries in runners.items() if len(entries) == 1
        }
        """``id`` of a code object -> the one module of the model that runs it (by id: hashing a code object hashes
        its whole body, each time)."""
        self.passing: frozenset[int] = frozenset(
            id(code) for code, entries in runners.items() if len(entries) == 1 and takes_cache(code)
        )
        """Ids in ``codes`` of code that is handed a cache (``CACHE_SLOTS``)."""

    def __len__(self) -> int:
        return len(self.modules)

    @property
    def root(self) -> torch.nn.Module | None:
        """The model's root module; None once it was released."""
        return self.modules[0][1]() if self.modules else None

    def path_of(self, obj: object) -> str | None:
        """The path of ``obj`` when it is one of the model's modules."""
        entry = self._by_id.get(id(obj))
        if entry is None or entry[1]() is not obj:
            return None
        return entry[0]
