"""The observer's hot path: what runs inside the model's calls.

An owner's wrapped methods set "this owner is running" (a ``ContextVar``); the wrapped cache
layer methods attribute the layer they ran on to that owner and re-measure it. Every hook calls
the wrapped function exactly once and returns its result or raises its exception unchanged;
whatever fails inside observation is logged once per site, turns observation off (figures
become absent), and never reaches the model. Module globals, not attributes, because each
hook runs for every cache update.

The counters change under ``lock`` (reentrant: a layer may die, and its finaliser run, while
the lock is held), which the heartbeat thread's sample takes too: without it, a sample that
corrects a layer's bytes while the model thread re-measures the same layer counts the change
twice and reports a peak that never was.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from modelkv_exporter.engine.log import get_logger
from modelkv_exporter.engine.observe.layers import kv_bytes, measure, plan_for, storages, structure_problem
from modelkv_exporter.engine.observe.records import LayerRecord, OwnerState

logger = get_logger("observe")

ORIGINAL = "__modelkv_original__"
"""Attribute of a wrapper holding the function it wraps."""
ENTRY = "__modelkv_entry__"
"""Attribute marking an owner method wrapper."""

running: contextvars.ContextVar[OwnerState | None] = contextvars.ContextVar("modelkv_owner", default=None)
records: dict[int, LayerRecord] = {}
"""Every observed layer by ``id``; a record leaves when its layer dies."""
lock = threading.RLock()
"""Held while counters change: by the hooks on the model's threads and by a sample on the heartbeat thread."""
_active = False
_broken: str | None = None
_graph_depth = 0
_logged_sites: set[str] = set()
_is_compiling: Callable[[], bool] = torch.compiler.is_compiling
discover: Callable[[object], tuple[OwnerState, int] | None] | None = None
"""Set by discovery: the owner of a layer first seen while no declaring owner runs, and the ``id`` of the
cache it belongs to (0: unknown); None: leave the layer alone."""


def active() -> bool:
    """Whether the hooks observe (installed, and nothing has failed)."""
    return _active


def broken() -> str | None:
    """What failed inside observation, if anything did."""
    return _broken


def activate() -> None:
    """Start observing (after the hooks are installed)."""
    global _active, _broken
    _broken = None
    _active = True


def deactivate() -> None:
    """Stop observing; hooks still installed pass straight through."""
    global _active
    _active = False


def reset() -> None:
    """Forget every layer record, failure and logged site (when the observer is removed)."""
    global _active, _broken, _graph_depth, discover
    _active = False
    _broken = None
    _graph_depth = 0
    discover = None
    records.clear()
    _logged_sites.clear()


def fail(site: str, error: BaseException) -> None:
    """Observation failed at ``site``: turn it off, keep the first cause, log each site once."""
    global _active, _broken
    _active = False
    if _broken is None:
        _broken = f"observation failed in {site}: {type(error).__name__}: {error}"
    if site not in _logged_sites:
        _logged_sites.add(site)
        logger.warning("modelkv: model-local KV observation failed in %s; it is now off", site, exc_info=error)


def _on_dead(record: LayerRecord) -> None:
    """A layer died: its bytes leave its owner's live total."""
    with lock:
        try:
            record.owner.live -= record.bytes
            record.bytes = 0
            if records.get(record.key) is record:
                del records[record.key]
        except Exception as error:  # pragma: no cover - defensive
            fail("layer finaliser", error)


def register(layer: object, owner: OwnerState) -> LayerRecord:
    """Attribute ``layer`` to ``owner`` from now on."""
    plan = plan_for(type(layer))
    record = LayerRecord(layer, _on_dead)
    record.owner = owner
    record.bytes = 0
    record.plan = plan
    record.key = key = id(layer)
    record.key_ref = None
    records[key] = record
    if plan.unknown is not None:
        owner.unknown = plan.unknown
    elif not plan.vetted:
        owner.pending.append(record)
    return record


def settle(owner: OwnerState) -> None:
    """Measure the layers created in this call that no update has measured yet."""
    pending = owner.pending
    owner.pending = []
    for record in pending:
        layer = record()
        if layer is None:
            continue
        plan = record.plan
        if plan.unknown is not None:
            continue
        if not plan.vetted:
            problem = structure_problem(layer, plan)
            if problem is not None:
                plan.unknown = record.owner.unknown = problem
                continue
        size = measure(layer, plan)
        delta = size - record.bytes
        if delta:
            record.bytes = size
            record.owner.add(delta)


def capturing() -> bool:
    """Whether a CUDA graph capture is under way."""
    return _graph_depth > 0


def discovered(layer: object) -> LayerRecord | None:
    """A layer first seen while no declaring owner runs: register it with the owner discovery finds, if any."""
    find = discover
    if find is None:
        return None
    found = find(layer)
    if found is None:
        return None
    target, record_group = found
    record = register(layer, target)
    record.group = record_group
    if _graph_depth:
        target.graph = "a cache was used during a CUDA graph capture; replays are not observable"
    if record.plan.vetted:
        target.pending.append(record)
    settle(target)
    return record


def touch(layer: Any) -> None:
    """After a layer was initialised or updated: attribute it, count the call, re-measure it."""
    owner = running.get()
    record = records.get(id(layer))
    if record is None:
        if owner is None:
            if discovered(layer) is None:
                return
            record = records[id(layer)]
        else:
            record = register(layer, owner)
    if owner is not None:
        if owner.counted_call != owner.call_number:
            owner.counted_call = owner.call_number
            owner.cache_calls += 1
        if _graph_depth:
            owner.graph = "a cache was used during a CUDA graph capture; replays are not observable"
        if owner.pending:
            settle(owner)
    plan = record.plan
    if plan.unknown is not None:
        return
    if plan.static:
        state = layer.__dict__
        keys = state.get("keys")
        values = state.get("values")
        key_ref = record.key_ref
        if key_ref is not None and key_ref() is keys and record.value_ref() is values:
            return
        size = kv_bytes(layer)
        if keys is not None and values is not None:
            record.key_ref, record.value_ref = weakref.ref(keys), weakref.ref(values)
        else:
            record.key_ref = None
    elif plan.fresh:  # tensors the update just made, or window views into them: their (base's) own size
        state = layer.__dict__
        keys = state.get("keys")
        values = state.get("values")
        size = 0
        if keys is not None:
            base = keys._base
            size = (keys if base is None else base).nbytes
        if values is not None and values is not keys:
            base = values._base
            size += (values if base is None else base).nbytes
    elif plan.keys_and_values:
        size = kv_bytes(layer)
    else:
        size = sum(storages(layer, plan.attributes).values())
    delta = size - record.bytes
    if delta:
        record.bytes = size
        target = record.owner
        live = target.live + delta
        target.live = live
        if live > target.interval_high_water:
            target.interval_high_water = live
            if live > target.high_water:
                target.high_water = live
        if target.on_change is not None:
            target.on_change(target)


def created(layer: object) -> None:
    """A layer was constructed or deep-copied while an owner runs: attribute it now, measure it later."""
    owner = running.get()
    if owner is None:
        discovered(layer)
        return
    record = register(layer, owner)
    if record.plan.vetted:
        owner.pending.append(record)
    owner.count_cache_call()


def wrap_layer_method(function: Callable[..., Any]) -> Callable[..., Any]:
    """``update`` and the like: run, then re-measure the layer."""

    @functools.wraps(function)
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = function(self, *args, **kwargs)
        if _active and not _is_compiling():
            lock.acquire()
            try:
                touch(self)
            except Exception as error:
                fail(f"{type(self).__name__}.{function.__name__}", error)
            finally:
                lock.release()
        return result

    setattr(hooked, ORIGINAL, function)
    return hooked


def wrap_layer_init(init: Callable[..., None]) -> Callable[..., None]:
    """``CacheLayerMixin.__init__``: every layer constructor reaches it through ``super().__init__()``."""

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if _active and not _is_compiling():
            with lock:
                try:
                    created(self)
                except Exception as error:
                    fail("cache layer creation", error)

    setattr(__init__, ORIGINAL, init)
    return __init__


def layer_setstate(self: Any, state: Any) -> None:
    """An added ``CacheLayerMixin.__setstate__``: ``copy.deepcopy`` and unpickling build layers through it.

    Restores the state as ``copy`` and ``pickle`` do without it, then attributes the layer.
    """
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state:
        self.__dict__.update(state)
    if slots:
        for key, value in slots.items():
            setattr(self, key, value)
    if _active and not _is_compiling():
        with lock:
            try:
                created(self)
            except Exception as error:
                fail("cache layer copy", error)


def enter(owner: OwnerState) -> contextvars.Token[OwnerState | None]:
    """An outermost call into ``owner`` begins."""
    owner.calls += 1
    owner.call_number += 1
    if _graph_depth:
        owner.graph = "the owner ran inside a CUDA graph capture; replays are not observable"
    return running.set(owner)


def leave(owner: OwnerState, token: contextvars.Token[OwnerState | None]) -> None:
    """The call ends: measure what it created and never updated."""
    running.reset(token)
    if owner.pending and _active:
        with lock:
            settle(owner)


def wrap_owner_method(bound: Callable[..., Any], owner: OwnerState) -> Callable[..., Any]:
    """One of an owner's methods, as an instance attribute: marks the owner running while it runs."""

    @functools.wraps(bound)
    def entered(*args: Any, **kwargs: Any) -> Any:
        if not _active or _is_compiling() or running.get() is owner:
            return bound(*args, **kwargs)
        try:
            token = enter(owner)
        except Exception as error:
            fail("owner entry", error)
            return bound(*args, **kwargs)
        try:
            return bound(*args, **kwargs)
        finally:
            try:
                leave(owner, token)
            except Exception as error:
                fail("owner exit", error)

    setattr(entered, ENTRY, True)
    return entered


def on_capture_begin() -> None:
    """A CUDA graph capture begins; an owner running now is not observable through replays."""
    global _graph_depth
    _graph_depth += 1
    owner = running.get()
    if owner is not None:
        owner.graph = "the owner captured a CUDA graph; replays are not observable"


def on_capture_end() -> None:
    """A CUDA graph capture ended."""
    global _graph_depth
    _graph_depth = max(0, _graph_depth - 1)


def on_replay() -> None:
    """A CUDA graph replays; the caches inside it change without any Python hook running."""
    owner = running.get()
    if owner is not None:
        owner.graph = "the owner replayed a CUDA graph; caches inside it are not observable"


def wrap_graph_method(
    function: Callable[..., Any], before: Callable[[], None] | None, after: Callable[[], None] | None
) -> Callable[..., Any]:
    """A ``torch.cuda.CUDAGraph`` method with a callback before or after it."""

    @functools.wraps(function)
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if before is not None and _active:
            try:
                before()
            except Exception as error:
                fail("CUDA graph hook", error)
        try:
            return function(self, *args, **kwargs)
        finally:
            if after is not None:
                try:
                    after()
                except Exception as error:
                    fail("CUDA graph hook", error)

    setattr(hooked, ORIGINAL, function)
    return hooked
