"""The vLLM general plugin: ``register()`` runs once in every vLLM process.

It does nothing unless ``MODELKV_SPOOL_DIR`` is set. Then it arranges for
``vllm.v1.worker.gpu_worker.Worker`` to be wrapped, but only when a process
actually imports that module (importing it costs seconds, and the API server
never needs it): at once if it is already imported, else through a one-shot
import hook. Each wrapper calls the original first and forwards every argument;
whatever our part raises is logged once and swallowed, so the engine loads and
serves as if we were not there.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

logger = logging.getLogger("vllm.modelkv_exporter")
"""Under vLLM's logger tree, so these lines follow vLLM's format and VLLM_LOGGING_LEVEL."""

TARGET = "vllm.v1.worker.gpu_worker"
MARKER = "__modelkv_wrapped__"
_registered = False
_failed: set[str] = set()
_hooked_bases: set[type] = set()


def register() -> None:
    """Entry point of ``vllm.general_plugins``; idempotent and cheap."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        from modelkv_exporter.engine_hook import HookConfig

        config = HookConfig.from_environ()
        if config is None:
            return
        module = sys.modules.get(TARGET)
        if module is not None:
            patch_worker(module, config)
        else:
            sys.meta_path.insert(0, _PatchOnImport(config))
    except Exception:
        logger.warning("modelkv: plugin registration failed; the engine runs without it", exc_info=True)


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

    def __init__(self, config: Any) -> None:
        self.config = config

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
                spec.loader = _PatchingLoader(spec.loader, lambda module: patch_worker(module, self.config))
                return spec
        return None


def _guarded(step: str, function: Callable[..., object], *args: Any) -> None:
    try:
        function(*args)
    except Exception:
        if step not in _failed:
            _failed.add(step)
            logger.warning("modelkv: %s failed; the engine continues without it", step, exc_info=True)


def _run_step(step: Callable[..., None], worker: Any, config: Any) -> None:
    if type(worker) not in _hooked_bases:
        patch_subclass(type(worker), config)
    _guarded(step.__name__, step, worker, config)


def _after(original: Callable[..., Any], step: Callable[..., None], config: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _run_step(step, self, config)
        return result

    setattr(wrapper, MARKER, True)
    return wrapper


def _before(original: Callable[..., Any], step: Callable[..., None], config: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        _run_step(step, self, config)
        return original(self, *args, **kwargs)

    setattr(wrapper, MARKER, True)
    return wrapper


def _plan() -> tuple[tuple[str, Callable[..., Callable[..., Any]], Callable[..., None]], ...]:
    from modelkv_exporter import engine_hook as hook

    return (
        ("load_model", _after, hook.after_load_model),
        ("initialize_from_config", _after, hook.after_kv_init),
        ("compile_or_warm_up_model", _after, hook.after_warm_up),
        ("shutdown", _before, hook.before_shutdown),
    )


def _wrap_methods(cls: type, config: Any, own_only: bool) -> list[str]:
    wrapped = []
    for name, wrap, step in _plan():
        original = cls.__dict__.get(name) if own_only else getattr(cls, name, None)
        if original is None or getattr(original, MARKER, False):
            continue
        setattr(cls, name, wrap(original, step, config))
        wrapped.append(name)
    return wrapped


def patch_subclass(cls: type, config: Any) -> None:
    """Wrap the lifecycle methods a Worker subclass overrides (vLLM's CPUWorker, vLLM-Omni's workers).

    Called when the hook first sees a worker of a class, so an override that does
    not call ``super()`` still reaches the hook; the steps are idempotent for
    overrides that do. Each class is handled once.
    """
    for klass in cls.__mro__:
        if klass in _hooked_bases:
            break
        _guarded("patch_subclass", _wrap_methods, klass, config, True)
        _hooked_bases.add(klass)


def patch_worker(module: ModuleType, config: Any) -> None:
    """Wrap the worker's lifecycle methods once; a method this vLLM lacks is skipped."""
    try:
        _hooked_bases.add(module.Worker)
        if _wrap_methods(module.Worker, config, False):
            logger.info("modelkv: publishing model-local KV declarations to %s", config.spool_dir)
    except Exception:
        logger.warning("modelkv: cannot hook vLLM's Worker; the engine runs without it", exc_info=True)
