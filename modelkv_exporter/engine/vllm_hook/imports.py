"""Run a callback on a module right after a process first imports it, without importing it ourselves.

Importing vLLM's worker modules costs seconds, and the API server never needs them; so the
hook waits for the process to import them. ``PatchOnImport`` is a ``sys.meta_path`` finder
that finds nothing itself: when one of its modules is imported, it asks the other finders for
the real spec and lends it a loader that runs the callback once the module has executed. It
removes itself once every module it waits for has been seen.

The lent loader is there only between the spec and the module's execution: before the module's
code runs, its ``__loader__`` and ``__spec__.loader`` are the real loader again, so the module
and everything that asks its loader later (``inspect.getsource``, tracebacks through
``linecache``, ``importlib.resources``, ``is_package``, ``importlib.reload``) meet the real one.
Until then every attribute the lent loader does not define is the real loader's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

OnLoaded = Callable[[ModuleType], None]


class _LentLoader:
    """Stands in for ``inner`` on one spec until ``exec_module``, which hands the module back to ``inner``."""

    def __init__(self, inner: Any, on_loaded: OnLoaded) -> None:
        self.inner = inner
        self.on_loaded = on_loaded

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.inner
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.inner
        self.inner.exec_module(module)
        try:
            self.on_loaded(module)
        except Exception:  # noqa: BLE001 - each callback logs its own failure; the import goes on
            pass


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
                if hasattr(spec.loader, "exec_module"):
                    spec.loader = _LentLoader(spec.loader, on_loaded)
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
