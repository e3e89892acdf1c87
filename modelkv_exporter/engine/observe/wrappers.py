"""An observed owner's methods, wrapped without changing what they are.

``wrap_owner_method`` marks an observed owner running while its method runs (``hooks.enter``/``hooks.leave``)
and passes any other instance straight through. The wrapper is of the method's own kind: a plain function's
is plain, a generator function's a generator function, a coroutine function's a coroutine function, an
asynchronous generator function's an asynchronous generator function (so ``inspect`` says the same of both).
A generator or coroutine runs the owner's code in steps, resumed by whoever consumes it: the owner is marked
running during each step only (``Steps``), and its call is counted once.

The wrapper is built on the original function's globals, and reaches the observer only through its closure
cells, each named ``_modelkv_*``: TorchScript, which resolves the names of the source it compiles (the
original's, through ``__wrapped__``) in the globals and closure of the function it was handed, finds the
original's globals; cloudpickle, which pickles a class defined in ``__main__`` by value, pickles the cells
(the original function; this module's functions and the hooks module, by reference) and no observer state.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from modelkv_exporter.engine.observe import hooks
from modelkv_exporter.engine.observe.records import OwnerState

Entry = tuple[OwnerState, contextvars.Token[OwnerState | None]]
"""An owner marked running, and the token that puts ``hooks.running`` back."""
GRAPH = "the owner ran inside a CUDA graph capture; replays are not observable"


def failed(site: str, error: Exception) -> None:
    """Observation failed at ``site``: turn it off (``hooks.fail``), even when the failure path fails too."""
    try:
        hooks.fail(site, error)
    except Exception:
        hooks._active = False
        hooks._late = site, type(error)


def begin(target: object, function: Callable[..., Any], counted: bool = True) -> Entry | None:
    """Mark ``target`` running if it is an observed owner not running already (``counted``: as a new call).

    None when it is not, when the model is being compiled, or when observation failed here. Never raises.
    """
    try:
        if hooks._is_compiling():
            return None
        owner = hooks.owners.get(id(target))
        if owner is None or owner.owner_ref() is not target or hooks.running.get() is owner:
            return None
        if counted:
            return owner, hooks.enter(owner)
        if hooks.capturing():
            owner.graph = GRAPH
        return owner, hooks.running.set(owner)
    except Exception as error:
        failed(f"owner entry ({function.__qualname__})", error)
        return None


def end(entry: Entry) -> None:
    """The owner's call (or step) ends: ``hooks.leave``. Never raises."""
    owner, token = entry
    try:
        hooks.leave(owner, token)
    except Exception as error:
        try:
            hooks.running.reset(token)
        except Exception:  # noqa: BLE001 - already reset by leave
            pass
        failed("owner exit", error)


class Call:
    """One call into an observed owner whose code runs in steps (a generator's, a coroutine's)."""

    __slots__ = ("target", "function", "counted")

    def __init__(self, target: object, function: Callable[..., Any]) -> None:
        self.target = target
        self.function = function
        self.counted = False

    def begin(self) -> Entry | None:
        """A step begins: the owner runs during it (the call is counted at its first observed step)."""
        if not hooks._active:
            return None
        entry = begin(self.target, self.function, not self.counted)
        if entry is not None:
            self.counted = True
        return entry


def call(target: object, function: Callable[..., Any]) -> Call | None:
    """A call of ``function`` on ``target`` to observe step by step, or None when ``target`` is no observed owner."""
    if not hooks._active or id(target) not in hooks.owners:
        return None
    return Call(target, function)


class Steps:
    """Stands between a consumer and a generator (or an awaitable's iterator): each step runs as the owner."""

    __slots__ = ("call", "inner")

    def __init__(self, call: Call, inner: Any) -> None:
        self.call = call
        self.inner = inner

    def __iter__(self) -> Steps:
        return self

    def __next__(self) -> Any:
        entry = self.call.begin()
        try:
            return next(self.inner)
        finally:
            if entry is not None:
                end(entry)

    def send(self, value: Any) -> Any:
        """Resume the generator with ``value`` as the owner."""
        entry = self.call.begin()
        try:
            return self.inner.send(value)
        finally:
            if entry is not None:
                end(entry)

    def throw(self, *error: Any) -> Any:
        """Raise ``error`` inside the generator, as the owner."""
        entry = self.call.begin()
        try:
            return self.inner.throw(*error)
        finally:
            if entry is not None:
                end(entry)

    def close(self) -> None:
        """Close the generator (its ``finally`` blocks run as the owner)."""
        entry = self.call.begin()
        try:
            self.inner.close()
        finally:
            if entry is not None:
                end(entry)


class Awaiting:
    """An awaitable whose steps run as the owner."""

    __slots__ = ("call", "inner")

    def __init__(self, call: Call, inner: Awaitable[Any]) -> None:
        self.call = call
        self.inner = inner

    def __await__(self) -> Generator[Any, Any, Any]:
        return Steps(self.call, self.inner.__await__())  # type: ignore[return-value]


def _plain(
    _modelkv_function: Callable[..., Any],
    _modelkv_hooks: types.ModuleType,
    _modelkv_begin: Callable[[object, Callable[..., Any]], Entry | None],
    _modelkv_end: Callable[[Entry], None],
    _modelkv_id: Callable[[object], int],
    **_: Any,
) -> Callable[..., Any]:
    def entered(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        if not _modelkv_hooks._active or _modelkv_id(self) not in _modelkv_hooks.owners:
            return _modelkv_function(self, *args, **kwargs)
        entry = _modelkv_begin(self, _modelkv_function)
        if entry is None:
            return _modelkv_function(self, *args, **kwargs)
        try:
            return _modelkv_function(self, *args, **kwargs)
        finally:
            _modelkv_end(entry)

    return entered


def _generator(
    _modelkv_function: Callable[..., Any],
    _modelkv_call: Callable[[object, Callable[..., Any]], Call | None],
    _modelkv_steps: type[Steps],
    **_: Any,
) -> Callable[..., Any]:
    def entered(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        inner = _modelkv_function(self, *args, **kwargs)
        observed = _modelkv_call(self, _modelkv_function)
        return (yield from (inner if observed is None else _modelkv_steps(observed, inner)))

    return entered


def _coroutine(
    _modelkv_function: Callable[..., Any],
    _modelkv_call: Callable[[object, Callable[..., Any]], Call | None],
    _modelkv_awaiting: type[Awaiting],
    **_: Any,
) -> Callable[..., Any]:
    async def entered(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        inner = _modelkv_function(self, *args, **kwargs)
        observed = _modelkv_call(self, _modelkv_function)
        return await (inner if observed is None else _modelkv_awaiting(observed, inner))

    return entered


def _async_generator(
    _modelkv_function: Callable[..., Any],
    _modelkv_call: Callable[[object, Callable[..., Any]], Call | None],
    _modelkv_awaiting: type[Awaiting],
    **_: Any,
) -> Callable[..., Any]:
    async def entered(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        inner = _modelkv_function(self, *args, **kwargs)
        observed = _modelkv_call(self, _modelkv_function)
        sent = thrown = None
        while True:
            step = inner.asend(sent) if thrown is None else inner.athrow(thrown)
            thrown = None
            try:
                value = await (step if observed is None else _modelkv_awaiting(observed, step))
            except StopAsyncIteration:
                return
            try:
                sent = yield value
            except GeneratorExit:
                closing = inner.aclose()
                await (closing if observed is None else _modelkv_awaiting(observed, closing))
                raise
            except BaseException as error:  # noqa: BLE001 - handed to the owner's generator, as async for would
                sent, thrown = None, error

    return entered


def _template(function: Callable[..., Any]) -> Callable[..., Callable[..., Any]]:
    if inspect.isasyncgenfunction(function):
        return _async_generator
    if inspect.iscoroutinefunction(function):
        return _coroutine
    if inspect.isgeneratorfunction(function):
        return _generator
    return _plain


def wrap_owner_method(function: types.FunctionType) -> types.FunctionType:
    """One of an owner class's methods, wrapped on the class: marks an observed owner running while it runs.

    Any other instance of the class (an unobserved one, a deep copy, an unpickled one) passes straight
    through, so copies run their own code on their own state and pickle as if nothing were wrapped.
    """
    made = _template(function)(
        _modelkv_function=function,
        _modelkv_hooks=hooks,
        _modelkv_begin=begin,
        _modelkv_end=end,
        _modelkv_call=call,
        _modelkv_steps=Steps,
        _modelkv_awaiting=Awaiting,
        _modelkv_id=id,
    )
    wrapper = types.FunctionType(made.__code__, function.__globals__, function.__name__, None, made.__closure__)
    functools.update_wrapper(wrapper, function)
    if function.__code__.co_flags & inspect.CO_ITERABLE_COROUTINE:
        wrapper = types.coroutine(wrapper)  # type: ignore[assignment]
    setattr(wrapper, hooks.ENTRY, True)
    setattr(wrapper, hooks.ORIGINAL, function)
    return wrapper
