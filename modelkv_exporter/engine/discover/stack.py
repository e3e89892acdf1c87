"""The walk that gives a new cache layer to a module on the call stack, for one model or several in one process.

``CodeIndex`` maps the code of the methods of every model that discovers (each model's ``ModuleMap.codes``) to
the module that runs it; ``innermost`` walks the stack outward from the hooks and returns the module that made
or keeps the cache. Frames are matched by ``f_code``: with one model, by that alone.

With several models, code one module of each runs (two instances of one architecture: a code object belongs to
a class, not to an instance) does not say which model runs it. The nearest module call outward does: the frame
of ``nn.Module.__call__`` (``_call_impl``, ``_wrapped_call_impl``) whose ``self`` is a module of one of the
models. That is the only frame whose locals are read (``frame.f_locals``), at most once a new layer, and only
where the code is several models'. It holds only the call's module, arguments and bound ``forward``, which it
keeps alive until it returns anyway: the snapshot CPython 3.11 and 3.12 store on a frame whose locals are read
keeps nothing alive longer, and no code of the model runs.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Sequence
from types import FrameType
from typing import Generic, TypeVar

import torch

from modelkv_exporter.engine.discover.module_map import MAX_FRAMES, ModuleMap

T = TypeVar("T")
ModuleRef = weakref.ReferenceType[torch.nn.Module]
Target = tuple[str, ModuleRef, T]
"""A module of a model: its path, the module (weakly), and whose model it is."""

SHALLOW_COPY = copy.copy.__code__
MODULE_CALL = torch.nn.Module._call_impl.__code__
"""The code of ``nn.Module.__call__``'s frame, whose ``self`` is the module called."""
WRAPPED_MODULE_CALL = getattr(torch.nn.Module, "_wrapped_call_impl", torch.nn.Module._call_impl).__code__
"""The frame around it (torch 2.1 and later), whose ``self`` is the same module."""
UNKNOWN = -1
"""``running_model``: no model's module call was found."""


class Shared(Generic[T]):
    """Code a module of each of several models runs: the module of each, by the model's position in the index."""

    __slots__ = ("by_model",)

    def __init__(self, by_model: dict[int, Target[T]]) -> None:
        self.by_model = by_model


class CodeIndex(Generic[T]):
    """The code of every method of the modules of one or more models (``ModuleMap.codes``), to the module that runs
    it; ``owners`` name the models (a ``Discovery`` each)."""

    def __init__(self, models: Sequence[tuple[T, ModuleMap]]) -> None:
        self.maps = tuple(modules for _, modules in models)
        codes: dict[int, Target[T] | Shared[T]] = {}
        first: dict[int, int] = {}
        passing: set[int] = set()
        for position, (owner, modules) in enumerate(models):
            for key, (path, module) in modules.codes.items():
                target = (path, module, owner)
                known = codes.get(key)
                if known is None:
                    codes[key] = target
                    first[key] = position
                elif isinstance(known, Shared):
                    known.by_model[position] = target
                else:
                    codes[key] = Shared({first[key]: known, position: target})
            passing |= modules.passing
        self.codes = codes
        """``id`` of a code object -> the module that runs it, or the module of each model that does (``Shared``)."""
        self.passing = frozenset(passing)
        """Ids in ``codes`` of code that is handed a cache (``module_map.CACHE_SLOTS``)."""


def innermost(
    index: CodeIndex[T], builders: frozenset[str], frame: FrameType | None
) -> tuple[Target[T] | None, int] | None:
    """The innermost module on the stack from ``frame`` outward that is not only handed the cache, and the ``id`` of
    the outermost frame of the files in ``builders`` (the cache module's and ``copy``'s) below it (0: none).

    Modules whose method takes ``past_key_values`` only pass the cache along (or fill an empty slot and return it),
    so the walk goes on outward to the module that made or keeps it; when every module found takes one, the
    innermost of them. At most ``MAX_FRAMES`` frames. None: the layer is a shallow copy (``copy.copy``), which
    shares every tensor with the layer it copies, and is left alone.
    """
    codes = index.codes
    passing = index.passing
    builder = 0
    model: int | None = None
    handed: Target[T] | None = None
    found: Target[T] | None = None
    for _ in range(MAX_FRAMES):
        if frame is None:
            break
        code = frame.f_code
        entry = codes.get(id(code))
        if entry is not None:
            if isinstance(entry, Shared):
                if model is None:
                    model = running_model(index.maps, frame)
                target = entry.by_model.get(model)
            else:
                target = entry
            if target is not None:
                if id(code) not in passing:
                    found = target
                    break
                handed = handed or target
        elif code.co_filename in builders and handed is None:
            if code is SHALLOW_COPY:
                return None
            builder = id(frame)
        frame = frame.f_back
    frame = None
    return found or handed, builder


def running_model(maps: Sequence[ModuleMap], frame: FrameType | None) -> int:
    """The position in ``maps`` of the model whose module the nearest module call from ``frame`` outward calls
    (``UNKNOWN``: none within ``MAX_FRAMES``). Reads the locals of that call's frame only."""
    for _ in range(MAX_FRAMES):
        if frame is None:
            break
        code = frame.f_code
        if code is MODULE_CALL or code is WRAPPED_MODULE_CALL:
            module = frame.f_locals.get("self")
            for position, modules in enumerate(maps):
                if modules.path_of(module) is not None:
                    return position
        frame = frame.f_back
    return UNKNOWN
