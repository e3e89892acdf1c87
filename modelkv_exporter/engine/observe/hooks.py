"""The observer's hot path: what runs inside the model's calls.

An owner's wrapped methods set "this owner is running" (a ``ContextVar``); the wrapped cache
layer methods attribute the layer they ran on to that owner and re-measure it. Every hook calls
the wrapped function exactly once and returns its result or raises its exception unchanged.
Whatever fails inside observation turns observation off (figures become absent) and never
reaches the model, not even when the failure path itself fails (at the recursion limit, out of
memory): it only sets flags and ``report``s a line the heartbeat logs later, holding no lock.
Module globals, not attributes, because each hook runs for every cache update.

The counters change under ``lock`` (reentrant: a layer may die, and its finaliser run, while
the lock is held), which the heartbeat thread's sample takes too: without it, a sample that
corrects a layer's bytes while the model thread re-measures the same layer counts the change
twice and reports a peak that never was. The finaliser of a dead layer takes no lock (the
collector runs it on any thread, maybe one holding a logging handler's lock): it queues the
record in ``dead``, which whoever takes ``lock`` next drains.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from modelkv_exporter.engine.log import get_logger, report
from modelkv_exporter.engine.observe.layers import (
    Unweighable,
    fresh_bytes,
    measure,
    pair_bytes,
    plan_for,
    same_tensors,
    structure_problem,
    tensors,
)
from modelkv_exporter.engine.observe.records import LayerRecord, OwnerState

logger = get_logger("observe")

ORIGINAL = "__modelkv_original__"
"""Attribute of a wrapper holding the function it wraps."""
ENTRY = "__modelkv_entry__"
"""Attribute marking an owner method wrapper."""
FAILED_SILENTLY = "observation failed in {site} ({error}), and so did its failure path (recursion limit?)"

running: contextvars.ContextVar[OwnerState | None] = contextvars.ContextVar("modelkv_owner", default=None)
records: dict[int, LayerRecord] = {}
"""Every observed layer by ``id``; a record leaves when its layer dies (at the next ``drain``)."""
states: dict[int, LayerRecord] = {}
"""Every observed layer by the ``id`` of its instance dict: ``copy.copy`` hands a layer's own dict to the copy."""
owners: dict[int, OwnerState] = {}
"""Every observed owner object's state, by ``id`` (checked against its weak reference: ids are reused)."""
lock = threading.RLock()
"""Held while counters change: by the hooks on the model's threads and by a sample on the heartbeat thread."""
dead: collections.deque[LayerRecord] = collections.deque()
"""Records of layers that died and whose bytes still count: appended lock-free, drained under ``lock``."""
_active = False
_broken: str | None = None
_late: tuple[str, type] | None = None
"""A failure whose failure path could not run: (site, error type), reported by the next ``broken()``."""
_graph_depth = 0
_logged_sites: set[str] = set()
_is_compiling: Callable[[], bool] = torch.compiler.is_compiling
_get = dict.get
discover: Callable[[object], tuple[OwnerState, int] | None] | None = None
"""Set by discovery: the owner of a layer first seen while no declaring owner runs, and the ``id`` of the
cache it belongs to (0: unknown); None: leave the layer alone."""


def active() -> bool:
    """Whether the hooks observe (installed, and nothing has failed)."""
    return _active


def broken() -> str | None:
    """What failed inside observation, if anything did (on the heartbeat thread, holding no lock)."""
    global _broken
    late = _late
    if _broken is None and late is not None:
        _broken = FAILED_SILENTLY.format(site=late[0], error=late[1].__name__)
        report(logger, "modelkv: model-local KV %s; it is now off", _broken)
    return _broken


def activate() -> None:
    """Start observing (after the hooks are installed)."""
    global _active, _broken, _late
    _broken = _late = None
    _active = True


def deactivate() -> None:
    """Stop observing; hooks still installed pass straight through."""
    global _active
    _active = False


def reset() -> None:
    """Forget every layer record, owner, failure and logged site (when the observer is removed)."""
    global _active, _broken, _late, _graph_depth, discover
    _active = False
    _broken = _late = None
    _graph_depth = 0
    discover = None
    records.clear()
    states.clear()
    owners.clear()
    dead.clear()
    _logged_sites.clear()


def fail(site: str, error: BaseException) -> None:
    """Observation failed at ``site``: turn it off, keep the first cause, report each site once. Never raises
    (but may not even start at the recursion limit: its callers turn observation off inline then)."""
    global _active, _broken
    _active = False
    try:
        if _broken is None:
            _broken = f"observation failed in {site}: {type(error).__name__}"
            _broken = f"{_broken}: {error}"
        if site not in _logged_sites:
            _logged_sites.add(site)
            report(logger, "modelkv: model-local KV observation failed in %s; it is now off", site, error=error)
    except Exception:  # noqa: BLE001 - the flags are set; the line is lost
        pass


_on_dead: Callable[[LayerRecord], None] = dead.append
"""A layer died (its record's weakref callback, on any thread, under any lock): queue the record for ``drain``.

``deque.append`` itself, no Python function: the collector runs it without a frame of ours, so it cannot meet the
recursion limit in a frame of ours, and a signal or asynchronous exception pending when the layer dies is raised in
the model's code afterwards, where a Python callback would have run it and CPython dropped it as unraisable (the
record lost with it)."""


def drain() -> None:
    """Take the layers that died out of their owners' live totals (holding ``lock``)."""
    while dead:
        record = dead.popleft()
        record.owner.live -= record.bytes
        record.bytes = 0
        if records.get(record.key) is record:
            del records[record.key]
        if states.get(record.state_key) is record:
            del states[record.state_key]


def register(layer: object, owner: OwnerState) -> LayerRecord:
    """Attribute ``layer`` to ``owner`` from now on."""
    plan = plan_for(type(layer))
    record = LayerRecord(layer, _on_dead)
    record.owner = owner
    record.bytes = 0
    record.plan = plan
    record.key = key = id(layer)
    record.key_ref = None
    record.twin = record.copies = None
    records[key] = record
    if plan.unknown is not None:
        record.state_key = 0
        owner.unknown = plan.unknown
        return record
    record.state_key = state_key = id(plan.state(layer))
    states[state_key] = record
    if not plan.vetted:
        owner.pending.append(record)
    return record


def shallow_copy(record: LayerRecord, state: object) -> None:
    """``record``'s layer was made by ``copy.copy`` from ``state``, a layer's own dict: link the two records."""
    source = states.get(id(state))
    if source is None or source is record:
        return
    layer = source()
    if layer is None or source.plan.state(layer) is not state:
        return
    record.twin = source
    if source.copies is None:
        source.copies = []
    source.copies.append(record)


def shared(record: LayerRecord) -> tuple[Any, ...]:
    """The tensors ``record``'s layer shares with the layer it is a shallow copy of (they count there)."""
    twin = record.twin
    if twin is None:
        return ()
    layer = twin()
    if layer is None:
        record.twin = None
        return ()
    return tensors(layer, twin.plan)


def remeasure(records: list[LayerRecord]) -> None:
    """Re-weigh the shallow copies of a layer that changed: tensors it no longer holds count for them now."""
    for record in records:
        layer = record()
        if layer is None or record.plan.unknown is not None:
            continue
        size = measure(layer, record.plan, shared(record))
        delta = size - record.bytes
        if delta:
            record.bytes = size
            record.owner.add(delta)
        if record.copies:
            remeasure(record.copies)


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
        try:
            size = measure(layer, plan, shared(record) if record.twin is not None else ())
        except Unweighable as problem:
            record.owner.unknown = str(problem)
            continue
        delta = size - record.bytes
        if delta:
            record.bytes = size
            record.owner.add(delta)


def capturing() -> bool:
    """Whether a CUDA graph capture is under way."""
    return _graph_depth > 0


def discovered(layer: object, state: object = None) -> LayerRecord | None:
    """A layer first seen while no declaring owner runs: register it with the owner discovery finds, if any
    (``state``: the dict it was shallow-copied from, if it was)."""
    find = discover
    if find is None:
        return None
    found = find(layer)
    if found is None:
        return None
    target, record_group = found
    record = register(layer, target)
    record.group = record_group
    if state is not None:
        shallow_copy(record, state)
    if _graph_depth:
        target.graph = "a cache was used during a CUDA graph capture; replays are not observable"
    if record.plan.vetted:
        target.pending.append(record)
    settle(target)
    return record


def touch(layer: Any) -> None:
    """After a layer was initialised or updated: attribute it, count the call, re-measure it (holding ``lock``)."""
    if dead:
        drain()
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
    try:
        if record.twin is not None:
            size = measure(layer, plan, shared(record))
        elif plan.static:
            state = plan.state(layer)
            keys = _get(state, "keys")
            values = _get(state, "values")
            key_ref = record.key_ref
            if key_ref is not None and key_ref() is keys and record.value_ref() is values:
                return
            size = pair_bytes(keys, values)
            record.key_ref, record.value_ref = same_tensors(keys, values)
        elif plan.fresh:  # tensors the update just made, or window views into them: their (base's) own size
            state = plan.state(layer)
            size = fresh_bytes(_get(state, "keys"), _get(state, "values"))
        else:
            size = measure(layer, plan)
    except Unweighable as problem:
        record.owner.unknown = str(problem)
        return
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
    if record.copies:
        remeasure(record.copies)


def created(layer: object, state: object = None) -> None:
    """A layer was constructed or copied (from ``state``) while an owner runs: attribute it now, measure it later
    (holding ``lock``)."""
    if dead:
        drain()
    owner = running.get()
    if owner is None:
        discovered(layer, state)
        return
    record = register(layer, owner)
    if state is not None:
        shallow_copy(record, state)
    if record.plan.vetted:
        owner.pending.append(record)
    owner.count_cache_call()


def wrap_layer_method(function: Callable[..., Any]) -> Callable[..., Any]:
    """``update`` and the like: run, then re-measure the layer."""
    site = function.__qualname__

    @functools.wraps(function)
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _active, _late
        result = function(self, *args, **kwargs)
        if _active:
            try:
                if not _is_compiling():
                    with lock:
                        touch(self)
            except Exception as error:
                try:
                    fail(site, error)
                except Exception:
                    _active = False
                    _late = site, type(error)
        return result

    setattr(hooked, ORIGINAL, function)
    return hooked


def wrap_layer_init(init: Callable[..., None]) -> Callable[..., None]:
    """``CacheLayerMixin.__init__``: every layer constructor reaches it through ``super().__init__()``."""

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        global _active, _late
        init(self, *args, **kwargs)
        if _active:
            try:
                if not _is_compiling():
                    with lock:
                        created(self)
            except Exception as error:
                try:
                    fail("cache layer creation", error)
                except Exception:
                    _active = False
                    _late = "cache layer creation", type(error)

    setattr(__init__, ORIGINAL, init)
    return __init__


def layer_setstate(self: Any, state: Any) -> None:
    """An added ``CacheLayerMixin.__setstate__``: ``copy.copy``, ``copy.deepcopy`` and unpickling build layers
    through it.

    Restores the state as ``copy`` and ``pickle`` do without it, then attributes the layer.
    """
    global _active, _late
    slots = None
    if type(state) is tuple and len(state) == 2:
        state, slots = state
    source = state if type(state) is dict else None
    if state:
        self.__dict__.update(state)
    if slots:
        for key, value in slots.items():
            setattr(self, key, value)
    if _active:
        try:
            if not _is_compiling():
                with lock:
                    created(self, source)
        except Exception as error:
            try:
                fail("cache layer copy", error)
            except Exception:
                _active = False
                _late = "cache layer copy", type(error)


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
            if dead:
                drain()
            settle(owner)


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
        global _active, _late
        if before is not None and _active:
            try:
                before()
            except Exception as error:
                try:
                    fail("CUDA graph hook", error)
                except Exception:
                    _active = False
                    _late = "CUDA graph hook", type(error)
        try:
            return function(self, *args, **kwargs)
        finally:
            if after is not None:
                try:
                    after()
                except Exception as error:
                    try:
                        fail("CUDA graph hook", error)
                    except Exception:
                        _active = False
                        _late = "CUDA graph hook", type(error)

    setattr(hooked, ORIGINAL, function)
    return hooked
