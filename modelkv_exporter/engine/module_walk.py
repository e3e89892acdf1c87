"""The model's module tree, walked once per question: by its real ``_modules`` dicts, each module once.

One walk for the two questions asked of it: which modules declare caches (``engine.protocol``) and every
module by its path (``engine.discover.module_map``). It reads ``_modules`` through ``nn.Module``'s real
``__dict__`` with ``dict``'s own methods (a dict subclass put in its place runs none of its own), so no subclass's
attribute hooks run, and builds a path string only for a module it yields.

``computed_weights``: the weights a module's legacy ``weight_norm`` / ``spectral_norm`` hook recomputes at
every forward, read from the same ``__dict__`` (the weights count them, discovery never reports them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

MODULE_DICT = torch.nn.Module.__dict__["__dict__"]
"""The real ``__dict__`` of every module."""
COMPUTED_WEIGHT_HOOKS: frozenset[type] = frozenset({WeightNorm, SpectralNorm})
"""torch's forward pre-hooks that keep a weight as a plain attribute of the module (``hook.name``) and write a new
tensor there before every forward (``torch.nn.utils.weight_norm``, ``spectral_norm``)."""


def computed_weights(state: dict[str, Any]) -> list[str]:
    """The attribute names of a module's computed weights, from its real ``__dict__`` (``state``): the ``name`` of
    each ``COMPUTED_WEIGHT_HOOKS`` hook in its ``_forward_pre_hooks`` (hooks of exactly those classes: torch's own
    code, nothing of the model's is read). Empty for a module without forward pre-hooks, at the cost of a look-up.

    ``torch.nn.utils.parametrize`` (and ``parametrizations.weight_norm``) keeps no computed tensor on the module (a
    property computes it at each access; ``parametrize.cached()`` keeps it in the parametrize module's own cache):
    its originals are parameters of ``module.parametrizations``, already weights.
    """
    hooks = dict.get(state, "_forward_pre_hooks")
    if type(hooks) is not OrderedDict or not hooks:
        return []
    names = []
    for hook in list(dict.values(hooks)):
        if type(hook) in COMPUTED_WEIGHT_HOOKS:
            name = vars(hook).get("name")
            if type(name) is str:
                names.append(name)
    return names


def children_of(module: torch.nn.Module) -> dict[str, torch.nn.Module | None]:
    """``module._modules``, read through ``nn.Module``'s real ``__dict__`` with ``dict``'s own ``get`` (never a
    subclass's attribute hooks, nor the methods of a dict subclass set as ``__dict__``)."""
    found = dict.get(MODULE_DICT.__get__(module, type(module)), "_modules")
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
