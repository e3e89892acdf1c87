"""The vLLM general plugin: ``register()`` runs once in every vLLM (and vLLM-Omni) process.

It does nothing unless ``MODELKV_SPOOL_DIR`` is set. Then it arranges for three things to be
patched, each only when the process imports its module (at once if it already has; importing
them ourselves would cost seconds in processes that never build a worker):

- ``vllm.v1.worker.worker_base.WorkerWrapperBase.init_worker``: after it builds a worker, the
  class of that worker is hooked, whatever platform it belongs to (vllm-ascend's ``NPUWorker``
  or any out-of-tree worker that is no subclass of vLLM's ``Worker``);
- ``vllm.v1.worker.gpu_worker.Worker``, the base of vLLM's own workers, for workers built
  without the wrapper;
- ``vllm_omni.diffusion.worker.diffusion_worker.DiffusionWorker``, vLLM-Omni's diffusion worker,
  which no vLLM wrapper builds.

``init_worker`` loads the plugins itself, so in a worker process ``register()`` may run inside
the very call that is about to build the worker: then the class that call resolves is hooked
at once (``in_flight_worker_class``).

A step runs before or after its method, or around it: a step ``around`` runs before and
returns what to run after, even when the method raises. A method that may end the engine by raising (the worker's
step, ``execute_model`` and ``sample_tokens``, and its memory set-up: the profile, the KV cache's allocation, the
warm-up, vLLM 0.34's ``extend_kv_cache``) has a step ``on_raise``: when the method raises an ``Exception``, it is
told (``lifecycle.ended_by``: the snapshot records why the engine ended) and the same exception is raised again
with a bare ``raise``, neither replaced, chained nor swallowed. The worker's step is wrapped by nothing else: its
wrapper adds one frame and a ``try`` to the hot path, nothing more.

Each wrapper calls the original and forwards every argument; whatever our part raises is
logged once and swallowed, so the engine loads and serves as if we were not there. A wrapper
that another wrapped method of the same worker calls (an override calling ``super()``) runs
only the original: each step runs once per call from outside.

All state (the settings, the classes patched, the steps that failed) belongs to one
``Registration``; the module keeps only the registration ``register()`` made, so that vLLM
calling it again in the same process changes nothing.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any, NamedTuple

from modelkv_exporter.engine.config import HookConfig
from modelkv_exporter.engine.engine_log import get_logger
from modelkv_exporter.engine.vllm_hook.imports import on_import

logger = get_logger("plugin")

WORKER_MODULE = "vllm.v1.worker.gpu_worker"
WRAPPER_MODULE = "vllm.v1.worker.worker_base"
DIFFUSION_MODULE = "vllm_omni.diffusion.worker.diffusion_worker"
MARKER = "__modelkv_wrapped__"

Step = Callable[..., Any]


class Method(NamedTuple):
    """A lifecycle method of a worker class and the step that runs ``when`` it is called.

    ``when`` is ``"before"``, ``"after"`` or ``"around"`` (the step runs before the method and
    returns a function, or None, to run after it), or ``"raising"`` (only ``on_raise``: the worker's step).
    A step ``with_arguments`` is called as ``step(worker, config, *args, **kwargs)`` with the method's arguments
    as its caller gave them. ``on_raise`` is called as ``on_raise(worker, config, error)`` when the method raises
    an ``Exception``, which is then raised again unchanged.
    """

    name: str
    when: str
    step: Step | None
    with_arguments: bool = False
    on_raise: Step | None = None


Plan = tuple[Method, ...]


def worker_plan() -> Plan:
    """The lifecycle of a vLLM worker (``WorkerBase``'s methods)."""
    from modelkv_exporter.engine.vllm_hook import lifecycle

    ended = lifecycle.ended_by
    return (
        Method("init_device", "after", lifecycle.after_init_device),
        Method("load_model", "after", lifecycle.after_load_model),
        Method("initialize_from_config", "after", lifecycle.after_kv_init, with_arguments=True, on_raise=ended),
        Method("compile_or_warm_up_model", "after", lifecycle.after_warm_up, on_raise=ended),
        Method("extend_kv_cache", "after", lifecycle.after_extend, on_raise=ended),
        Method("determine_available_memory", "around", lifecycle.hold_peak_resets, on_raise=ended),
        Method("execute_model", "raising", None, on_raise=ended),
        Method("sample_tokens", "raising", None, on_raise=ended),
        *sleep_steps(),
        Method("shutdown", "before", lifecycle.before_shutdown),
    )


def sleep_steps() -> Plan:
    """vLLM's sleep mode, in every worker that has it (vLLM's and vLLM-Omni's diffusion worker)."""
    from modelkv_exporter.engine.vllm_hook import lifecycle

    return (
        Method("sleep", "after", lifecycle.after_sleep, with_arguments=True),
        Method("wake_up", "after", lifecycle.after_wake_up, with_arguments=True),
        Method("discard", "after", lifecycle.after_discard, with_arguments=True),
    )


def diffusion_plan() -> Plan:
    """The lifecycle of a vLLM-Omni ``DiffusionWorker`` (its ``__init__`` loads the model)."""
    from modelkv_exporter.engine.vllm_hook import lifecycle

    return (
        Method("init_device", "after", lifecycle.after_init_device),
        Method("load_model", "after", lifecycle.after_load_model),
        Method("set_kv_cache_configs", "after", lifecycle.after_kv_init, with_arguments=True),
        *sleep_steps(),
        Method("shutdown", "before", lifecycle.before_shutdown),
    )


def in_flight_worker_class(wrapper_base: type) -> type | None:
    """The worker class an ``init_worker`` running on this thread's stack is about to build, if any.

    Imports the class's module, as that ``init_worker`` does a moment later.
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "init_worker" else None
        if isinstance(owner, wrapper_base):
            config = frame.f_locals.get("vllm_config") or vars(owner).get("vllm_config")
            name = getattr(getattr(config, "parallel_config", None), "worker_cls", None)
            if not isinstance(name, str) or "." not in name:
                return None
            module_name, _, class_name = name.rpartition(".")
            found = getattr(importlib.import_module(module_name), class_name, None)
            return found if isinstance(found, type) else None
        frame = frame.f_back
    return None


class Registration:
    """One registration of the hook: its settings, the classes it patched, the steps that failed."""

    def __init__(self, config: HookConfig) -> None:
        self.config = config
        self.failed: set[str] = set()
        self.hooked: set[type] = set()
        self._calls = threading.local()
        self._announced = False

    def announce(self) -> None:
        """Say once per process that the hook is active: the line to look for in an engine's log."""
        if not self._announced:
            self._announced = True
            logger.info("modelkv: publishing model-local KV declarations to %s", self.config.spool_dir)

    def install(self) -> None:
        """Patch each target module now if it is imported, else when it is."""
        on_import(
            {
                WRAPPER_MODULE: self.patch_worker_wrapper,
                WORKER_MODULE: self.patch_worker,
                DIFFUSION_MODULE: self.patch_diffusion_worker,
            }
        )

    def guarded(self, step: str, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``function`` and return its result; a failure is logged the first time ``step`` fails, never raised."""
        try:
            return function(*args, **kwargs)
        except Exception:
            if step not in self.failed:
                self.failed.add(step)
                logger.warning("modelkv: %s failed; the engine continues without it", step, exc_info=True)
            return None

    def run_step(
        self, method: Method, worker: Any, plan: Plan, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """One lifecycle step for ``worker``, after making sure its own class's overrides are hooked too.

        A step ``with_arguments`` gets the method's positional and keyword arguments as the caller gave them.
        """
        if type(worker) not in self.hooked:
            self.patch_subclass(type(worker), plan)
        if not method.with_arguments:
            args, kwargs = (), None
        if method.step is None:
            return None
        return self.guarded(method.step.__name__, method.step, worker, self.config, *args, **(kwargs or {}))

    def ended_by(self, method: Method, worker: Any, plan: Plan, error: BaseException) -> None:
        """``method`` of ``worker`` raised ``error``: run its ``on_raise`` step, guarded (it keeps no reference)."""
        if type(worker) not in self.hooked:
            self.patch_subclass(type(worker), plan)
        if method.on_raise is not None:
            self.guarded(method.on_raise.__name__, method.on_raise, worker, self.config, error)

    def _wrap_raising(self, original: Callable[..., Any], method: Method, plan: Plan) -> Callable[..., Any]:
        """``original`` as it is, but for telling ``ended_by`` what it raised before raising it again unchanged."""
        ended_by = self.ended_by

        @functools.wraps(original)
        def raising(worker: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(worker, *args, **kwargs)
            except Exception as error:
                ended_by(method, worker, plan, error)
                raise

        setattr(raising, MARKER, True)
        return raising

    def _active(self) -> set[tuple[int, str]]:
        active: set[tuple[int, str]] | None = getattr(self._calls, "active", None)
        if active is None:
            active = self._calls.active = set()
        return active

    def _wrap(self, original: Callable[..., Any], method: Method, plan: Plan) -> Callable[..., Any]:
        if method.on_raise is not None:
            raising = self._wrap_raising(original, method, plan)
            if method.when == "raising":
                return raising
            original = raising

        @functools.wraps(original)
        def wrapper(worker: Any, *args: Any, **kwargs: Any) -> Any:
            key = (id(worker), method.name)
            active = self._active()
            if key in active:
                return original(worker, *args, **kwargs)
            active.add(key)
            try:
                if method.when == "around":
                    undo = self.run_step(method, worker, plan, args, kwargs)
                    try:
                        return original(worker, *args, **kwargs)
                    finally:
                        if callable(undo) and method.step is not None:
                            self.guarded(method.step.__name__, undo)
                if method.when == "before":
                    self.run_step(method, worker, plan, args, kwargs)
                result = original(worker, *args, **kwargs)
                if method.when == "after":
                    self.run_step(method, worker, plan, args, kwargs)
                return result
            finally:
                active.discard(key)

        setattr(wrapper, MARKER, True)
        return wrapper

    def wrap_methods(self, cls: type, plan: Plan, own_only: bool) -> list[str]:
        """Wrap ``cls``'s lifecycle methods (only those it defines itself when ``own_only``); returns their names."""
        wrapped = []
        for method in plan:
            original = cls.__dict__.get(method.name) if own_only else getattr(cls, method.name, None)
            if original is None or getattr(original, MARKER, False):
                continue
            setattr(cls, method.name, self._wrap(original, method, plan))
            wrapped.append(method.name)
        return wrapped

    def patch_subclass(self, cls: type, plan: Plan | None = None) -> None:
        """Wrap the lifecycle methods a worker class and its bases override, each class once.

        Called when the hook first sees a worker of a class, so an override that does not
        call ``super()`` still reaches the hook.
        """
        for klass in cls.__mro__:
            if klass in self.hooked:
                break
            self.guarded("patch_subclass", self.wrap_methods, klass, plan or worker_plan(), True)
            self.hooked.add(klass)

    def patch_worker_class(self, cls: type) -> None:
        """Hook a worker class any platform defines: its lifecycle methods, as it resolves them."""
        if cls in self.hooked:
            return
        self.wrap_methods(cls, worker_plan(), False)
        self.patch_subclass(cls)
        self.announce()
        logger.info("modelkv: hooked worker class %s.%s", cls.__module__, cls.__qualname__)

    def patch_worker(self, module: ModuleType) -> None:
        """Wrap vLLM's base ``Worker`` once; a method this vLLM lacks is skipped."""
        try:
            self.hooked.add(module.Worker)
            if self.wrap_methods(module.Worker, worker_plan(), False):
                self.announce()
        except Exception:
            logger.warning("modelkv: cannot hook vLLM's Worker; the engine runs without it", exc_info=True)

    def patch_worker_wrapper(self, module: ModuleType) -> None:
        """Hook every worker ``WorkerWrapperBase.init_worker`` builds, and the one it is building now."""
        try:
            wrapper_base = module.WorkerWrapperBase
            original = wrapper_base.__dict__["init_worker"]
            if not getattr(original, MARKER, False):

                @functools.wraps(original)
                def init_worker(wrapper: Any, *args: Any, **kwargs: Any) -> Any:
                    result = original(wrapper, *args, **kwargs)
                    worker = vars(wrapper).get("worker")
                    if worker is not None:
                        self.guarded("patch_worker_class", self.patch_worker_class, type(worker))
                    return result

                setattr(init_worker, MARKER, True)
                wrapper_base.init_worker = init_worker
            building = in_flight_worker_class(wrapper_base)
            if building is not None:
                self.patch_worker_class(building)
        except Exception:
            logger.warning("modelkv: cannot hook vLLM's worker wrapper; the engine runs without it", exc_info=True)

    def patch_diffusion_worker(self, module: ModuleType) -> None:
        """Hook vLLM-Omni's ``DiffusionWorker`` and, before one is built, its class's own overrides.

        ``DiffusionWorker.__init__`` itself loads the model, so a class found after
        construction would be hooked too late; its ``__init__`` is wrapped instead.
        """
        try:
            cls = module.DiffusionWorker
            plan = diffusion_plan()
            self.hooked.add(cls)
            wrapped = self.wrap_methods(cls, plan, False)
            original = cls.__dict__["__init__"]
            if not getattr(original, MARKER, False):

                @functools.wraps(original)
                def __init__(worker: Any, *args: Any, **kwargs: Any) -> None:
                    if type(worker) not in self.hooked:
                        self.guarded("patch_subclass", self.patch_subclass, type(worker), plan)
                    original(worker, *args, **kwargs)

                setattr(__init__, MARKER, True)
                cls.__init__ = __init__
            if wrapped:
                self.announce()
        except Exception:
            logger.warning("modelkv: cannot hook vLLM-Omni's DiffusionWorker; it runs without it", exc_info=True)


_registration: Registration | None = None
_registered = False


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
