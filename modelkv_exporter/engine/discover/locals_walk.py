"""The attribution walk that reads frames' locals: opt-in (``MODELKV_DISCOVER_READ_LOCALS=1``), off by default.

It follows a cache through every argument of the frames it walks: the module that built or keeps a cache is the
innermost one on the stack that was not handed that cache, in any argument (``*args`` and ``**kwargs`` one level
in), or an empty ``past_key_values`` slot; the cache is the ``Cache`` whose method runs, or the one
``copy.deepcopy`` rebuilds. It tells caches apart exactly, and follows caches handed under any name; with several
models in one process, it tells their modules apart by the frames' ``self`` too.

What it costs: it reads ``f_locals`` of every frame with a ``self`` it passes, which on CPython 3.11 stores a
snapshot of that frame's locals on the frame, keeping every tensor the frame deletes later alive until the frame
returns (a runner's 64 MiB input, a ``forward``'s scratch tensors); and it costs more per new layer the deeper the
caller's stack (docs/benchmarks.md).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping, Sequence
from types import CodeType, FrameType
from typing import Any

from modelkv_exporter.engine.discover.module_map import ModuleMap, cache_slots

MAX_FRAMES = 200
"""Frames this walk looks through at most."""
RECONSTRUCT = getattr(getattr(copy, "_reconstruct", None), "__code__", None)


def handed(code: CodeType, local: Mapping[str, Any], cache: object) -> bool:
    """Whether a frame was handed ``cache`` in one of its arguments (``*args`` and ``**kwargs`` one level in), or an
    empty cache slot (``past_key_values=None``) that it fills with a cache it returns to its caller."""
    count = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames
    slots = cache_slots(code)
    for name in names[1:count]:
        value = local.get(name)
        if value is cache or (value is None and name in slots):
            return True
    extra = count
    if code.co_flags & inspect.CO_VARARGS:
        if any(item is cache for item in local.get(names[extra], ())):
            return True
        extra += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        keywords = local.get(names[extra])
        if isinstance(keywords, dict):
            for name, value in keywords.items():
                if value is cache or (value is None and name in slots):
                    return True
    return False


def find(
    maps: Sequence[ModuleMap], cache_type: type | None, frame: FrameType | None
) -> tuple[tuple[int, str, object] | None, int]:
    """The module that built or keeps the cache being built above ``frame`` (None: no module of any model in
    ``maps``), as the position of its model in ``maps``, its path and the module; and the ``id`` of that cache
    (0: unknown)."""
    cache: object = None
    innermost: tuple[int, str, object] | None = None
    for _ in range(MAX_FRAMES):
        if frame is None:
            break
        code = frame.f_code
        if code is RECONSTRUCT:
            built = frame.f_locals.get("y")
            if cache is None and cache_type is not None and isinstance(built, cache_type):
                cache = built
        elif code.co_argcount and code.co_varnames[0] == "self":
            local = frame.f_locals
            obj = local.get("self")
            found = _module_of(maps, obj)
            if found is not None:
                if cache is None or not handed(code, local, cache):
                    return found, id(cache) if cache is not None else 0
                innermost = innermost or found
            elif cache is None and cache_type is not None and isinstance(obj, cache_type):
                cache = obj
        frame = frame.f_back
    return innermost, id(cache) if cache is not None else 0


def _module_of(maps: Sequence[ModuleMap], obj: object) -> tuple[int, str, object] | None:
    """``obj``'s model's position in ``maps`` and its path there, when it is a module of one of them."""
    for position, modules in enumerate(maps):
        path = modules.path_of(obj)
        if path is not None:
            return position, path, obj
    return None
