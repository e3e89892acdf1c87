"""Run a callback on a module right after a process imports it, without importing it ourselves.

Importing vLLM's worker modules costs seconds, and the API server never needs them; so the
hook waits for the process to import them. ``PatchOnImport`` is a ``sys.meta_path`` finder
that finds nothing itself: when one of its modules is imported, it asks the other finders for
the real spec and lends it a loader that runs the callback once the module has executed. It
stays for the process's life: ``importlib.reload`` finds a module's spec again through
``sys.meta_path`` and executes the module anew (new classes), and the callback runs again on it;
so does a module imported again after it was taken out of ``sys.modules``. For the modules it
does not wait for it costs one dictionary look-up per import.

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
    """Calls ``waiting[name](module)`` after each import of each module ``name``, a reload included."""

    def __init__(self, waiting: dict[str, OnLoaded]) -> None:
        self.waiting = dict(waiting)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        on_loaded = self.waiting.get(fullname)
        if on_loaded is None:
            return None
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
    """Run each callback now on an imported module, and on each later import or reload of every one."""
    sys.meta_path.insert(0, PatchOnImport(modules))
    for name, on_loaded in modules.items():
        module = sys.modules.get(name)
        if module is not None:
            on_loaded(module)
