"""The vLLM general plugin: ``register()`` runs once in every vLLM process.

It does nothing unless ``MODELKV_SPOOL_DIR`` is set. Then it arranges for
``vllm.v1.worker.gpu_worker.Worker`` to be wrapped, but only when a process actually imports
that module (importing it costs seconds, and the API server never needs it): at once if it is
already imported, else through a one-shot import hook. Each wrapper calls the original first
and forwards every argument; whatever our part raises is logged once and swallowed, so the
engine loads and serves as if we were not there.

All state (the settings, the classes patched, the steps that failed) belongs to one
``Registration``; the module keeps only the registration ``register()`` made, so that vLLM
calling it again in the same process changes nothing.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from modelkv_exporter.engine.log import get_logger
from modelkv_exporter.engine.vllm_hook.config import HookConfig

logger = get_logger("plugin")

TARGET = "vllm.v1.worker.gpu_worker"
MARKER = "__modelkv_wrapped__"

Step = Callable[[Any, HookConfig], None]
Wrap = Callable[[Callable[..., Any], Step], Callable[..., Any]]


class Registration:
    """One registration of the hook: its settings, the classes it patched, the steps that failed."""

    def __init__(self, config: HookConfig) -> None:
        self.config = config
        self.failed: set[str] = set()
        self.hooked: set[type] = set()

    def install(self) -> None:
        """Patch vLLM's Worker now if its module is imported, else when it is."""
        module = sys.modules.get(TARGET)
        if module is not None:
            self.patch_worker(module)
        else:
            sys.meta_path.insert(0, _PatchOnImport(self))

    def guarded(self, step: str, function: Callable[..., object], *args: Any) -> None:
        """Run ``function``; a failure is logged the first time ``step`` fails, and never raised."""
        try:
            function(*args)
        except Exception:
            if step not in self.failed:
                self.failed.add(step)
                logger.warning("modelkv: %s failed; the engine continues without it", step, exc_info=True)

    def run_step(self, step: Step, worker: Any) -> None:
        """One lifecycle step for ``worker``, after making sure its own class's overrides are hooked too."""
        if type(worker) not in self.hooked:
            self.patch_subclass(type(worker))
        self.guarded(step.__name__, step, worker, self.config)

    def _after(self, original: Callable[..., Any], step: Step) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(worker: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(worker, *args, **kwargs)
            self.run_step(step, worker)
            return result

        setattr(wrapper, MARKER, True)
        return wrapper

    def _before(self, original: Callable[..., Any], step: Step) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(worker: Any, *args: Any, **kwargs: Any) -> Any:
            self.run_step(step, worker)
            return original(worker, *args, **kwargs)

        setattr(wrapper, MARKER, True)
        return wrapper

    def _plan(self) -> tuple[tuple[str, Wrap, Step], ...]:
        from modelkv_exporter.engine.vllm_hook import lifecycle

        return (
            ("load_model", self._after, lifecycle.after_load_model),
            ("initialize_from_config", self._after, lifecycle.after_kv_init),
            ("compile_or_warm_up_model", self._after, lifecycle.after_warm_up),
            ("shutdown", self._before, lifecycle.before_shutdown),
        )

    def wrap_methods(self, cls: type, own_only: bool) -> list[str]:
        """Wrap ``cls``'s lifecycle methods (only those it defines itself when ``own_only``); returns their names."""
        wrapped = []
        for name, wrap, step in self._plan():
            original = cls.__dict__.get(name) if own_only else getattr(cls, name, None)
            if original is None or getattr(original, MARKER, False):
                continue
            setattr(cls, name, wrap(original, step))
            wrapped.append(name)
        return wrapped

    def patch_subclass(self, cls: type) -> None:
        """Wrap the lifecycle methods a Worker subclass overrides (vLLM's CPUWorker, vLLM-Omni's workers).

        Called when the hook first sees a worker of a class, so an override that does not call
        ``super()`` still reaches the hook; the steps are idempotent for overrides that do.
        Each class is handled once.
        """
        for klass in cls.__mro__:
            if klass in self.hooked:
                break
            self.guarded("patch_subclass", self.wrap_methods, klass, True)
            self.hooked.add(klass)

    def patch_worker(self, module: ModuleType) -> None:
        """Wrap the worker's lifecycle methods once; a method this vLLM lacks is skipped."""
        try:
            self.hooked.add(module.Worker)
            if self.wrap_methods(module.Worker, False):
                logger.info("modelkv: publishing model-local KV declarations to %s", self.config.spool_dir)
        except Exception:
            logger.warning("modelkv: cannot hook vLLM's Worker; the engine runs without it", exc_info=True)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, on_loaded: Callable[[ModuleType], None]) -> None:
        self.inner = inner
        self.on_loaded = on_loaded

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.on_loaded(module)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when the worker module is imported, wraps its loader to patch it."""

    def __init__(self, registration: Registration) -> None:
        self.registration = registration

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self.registration.patch_worker)
                return spec
        return None


_registration: Registration | None = None
_registered = False


def registration() -> Registration | None:
    """The registration ``register()`` made in this process (None when inactive)."""
    return _registration


def register() -> None:
    """Entry point of ``vllm.general_plugins``; idempotent and cheap."""
    global _registered, _registration
    if _registered:
        return
    _registered = True
    try:
        config = HookConfig.from_environ()
        if config is None:
            return
        _registration = Registration(config)
        _registration.install()
    except Exception:
        logger.warning("modelkv: plugin registration failed; the engine runs without it", exc_info=True)
