"""The model's module tree, walked once per question: by its real ``_modules`` dicts, each module once.

One walk for the two questions asked of it: which modules declare caches (``engine.protocol``) and every
module by its path (``engine.discover.modules``). It reads ``_modules`` through ``nn.Module``'s real
``__dict__``, so no subclass's attribute hooks run, and builds a path string only for a module it yields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

MODULE_DICT = torch.nn.Module.__dict__["__dict__"]
"""The real ``__dict__`` of every module."""


def children_of(module: torch.nn.Module) -> dict[str, torch.nn.Module | None]:
    """``module._modules``, read through ``nn.Module``'s real ``__dict__`` (never a subclass's attribute hooks)."""
    found = MODULE_DICT.__get__(module, type(module)).get("_modules")
    return found if type(found) is dict else {}


def walk_modules(
    root: torch.nn.Module, keep: Callable[[torch.nn.Module], bool] | None = None
) -> Iterator[tuple[str, torch.nn.Module]]:
    """``(path, module)`` for ``root`` (path ``""``) and every module below it, each once, in ``named_modules()``
    order; with ``keep``, only the modules it accepts (the walk still goes below the others)."""
    if keep is None or keep(root):
        yield "", root
    seen = {id(root)}
    children = [iter(list(children_of(root).items()))]
    names: list[str] = []
    while children:
        for name, child in children[-1]:
            if child is None or id(child) in seen or not issubclass(type(child), torch.nn.Module):
                continue
            seen.add(id(child))
            if keep is None or keep(child):
                yield ".".join([*names, name]), child
            below = children_of(child)
            if below:
                children.append(iter(list(below.items())))
                names.append(name)
                break
        else:
            children.pop()
            if names:
                names.pop()
