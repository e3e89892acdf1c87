"""The model's modules by path, and the innermost of them on the call stack.

``ModuleMap`` is built once, after load: every module of the model with its path (``""`` = the
root), held weakly. ``innermost`` walks the caller's frames for the first ``self`` that is one of
them; it runs only when a cache layer is first seen, never per update.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from types import FrameType

import torch

MAX_FRAMES = 200
"""Frames ``innermost`` looks through at most."""


def walk_modules(root: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """``(path, module)`` for ``root`` and every module below it, each once, in ``named_modules()`` order."""
    yield "", root
    seen = {id(root)}
    children = [iter(root._modules.items())]
    names: list[str] = []
    while children:
        for name, child in children[-1]:
            if child is None or id(child) in seen:
                continue
            seen.add(id(child))
            yield ".".join([*names, name]), child
            if child._modules:
                children.append(iter(child._modules.items()))
                names.append(name)
                break
        else:
            children.pop()
            if names:
                names.pop()


class ModuleMap:
    """Every module of one model: path by ``id``, checked against a weak reference (ids are reused)."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.modules: list[tuple[str, weakref.ReferenceType[torch.nn.Module]]] = []
        self._by_id: dict[int, tuple[str, weakref.ReferenceType[torch.nn.Module]]] = {}
        for path, module in walk_modules(root):
            entry = (path, weakref.ref(module))
            self.modules.append(entry)
            self._by_id[id(module)] = entry

    def __len__(self) -> int:
        return len(self.modules)

    def path_of(self, obj: object) -> str | None:
        """The path of ``obj`` when it is one of the model's modules."""
        entry = self._by_id.get(id(obj))
        if entry is None or entry[1]() is not obj:
            return None
        return entry[0]

    def innermost(self, frame: FrameType | None = None) -> tuple[str, torch.nn.Module] | None:
        """The innermost module of the model running on the stack above ``frame`` (the caller's by default)."""
        frame = sys._getframe(1) if frame is None else frame
        by_id = self._by_id
        for _ in range(MAX_FRAMES):
            if frame is None:
                return None
            code = frame.f_code
            if code.co_argcount and code.co_varnames[0] == "self":
                obj = frame.f_locals.get("self")
                entry = by_id.get(id(obj))
                if entry is not None and entry[1]() is obj:
                    return entry[0], obj  # type: ignore[return-value]
            frame = frame.f_back
        return None
