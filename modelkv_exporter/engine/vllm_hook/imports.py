"""Run a callback on a module right after a process first imports it, without importing it ourselves.

Importing vLLM's worker modules costs seconds, and the API server never needs them; so the
hook waits for the process to import them. ``PatchOnImport`` is a ``sys.meta_path`` finder
that finds nothing itself: when one of its modules is imported, it asks the other finders for
the real spec and wraps its loader, so the callback runs once the module has executed. It
removes itself once every module it waits for has been seen.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

OnLoaded = Callable[[ModuleType], None]


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, on_loaded: OnLoaded) -> None:
        self.inner = inner
        self.on_loaded = on_loaded

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.on_loaded(module)


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Calls ``waiting[name](module)`` after the first import of each module ``name``."""

    def __init__(self, waiting: dict[str, OnLoaded]) -> None:
        self.waiting = dict(waiting)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        on_loaded = self.waiting.pop(fullname, None)
        if on_loaded is None:
            return None
        if not self.waiting and self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, on_loaded)
                return spec
        return None


def on_import(modules: dict[str, OnLoaded]) -> None:
    """Run each callback now on an imported module, and on first import for the others."""
    waiting = {}
    for name, on_loaded in modules.items():
        module = sys.modules.get(name)
        if module is not None:
            on_loaded(module)
        else:
            waiting[name] = on_loaded
    if waiting:
        sys.meta_path.insert(0, PatchOnImport(waiting))
