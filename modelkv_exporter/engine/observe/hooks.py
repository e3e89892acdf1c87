"""The observer's hot path: what runs inside the model's calls.

An owner's wrapped methods set "this owner is running" (a ``ContextVar``); the wrapped cache
layer methods attribute the layer they ran on to that owner and re-measure it. Every hook calls
the wrapped function exactly once and returns its result or raises its exception unchanged.
Whatever fails inside observation turns observation off (figures become absent) and never
reaches the model, not even when the failure path itself fails (at the recursion limit, out of
memory): it only sets flags and ``report``s a line the heartbeat logs later, holding no lock.
Module globals, not attributes, because each hook runs for every cache update.

A model thread never waits for a lock: the collector may run a model's finaliser on any thread, and that finaliser
may take a lock of the model's whose holder is inside our hook. So the hot path only measures a layer and hands
``(record, bytes now)`` over in ``changes`` (``deque.append`` is atomic); a dead layer's record is queued there
too, by ``changes.append`` itself as its weak reference's callback (no Python code runs in the collector). Whoever holds ``lock`` (a sample, discovery: the heartbeat's side) ``drain``s them into
the counters in the order they were handed over, so the peaks are those a lock on the hot path would have seen. A model
thread only tries ``lock`` (``_try_drain``), never waits for it: for an owner whose every change must be applied at
once (``on_change``) and when ``BACKLOG`` changes wait. The index (``records``, ``states``) gains entries on the
model's threads and loses dead ones in ``drain`` through ``_remove_dead_weakref``, which deletes an entry only if it
is still a dead record (a new layer at the same address keeps its own).
"""

from __future__ import annotations

import collections
import contextvars
import functools
import os
import threading
from _weakref import _remove_dead_weakref  # type: ignore[attr-defined]  # CPython 3.6+, not in typeshed
from collections.abc import Callable
from typing import Any

import torch

from modelkv_exporter.engine.engine_log import get_logger, report
from modelkv_exporter.engine.observe.layers import (
    Unweighable,
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
"""Held by whoever ``drain``s into the counters (a sample, discovery); a model thread only tries it, never waits."""
GONE = -1
"""``LayerRecord.bytes`` once the layer's death was drained: a change still queued for it is dropped."""
changes: collections.deque[tuple[LayerRecord, int] | LayerRecord] = collections.deque()
"""What the model's threads measured and which layers died, in order: a layer's record and its bytes now, or the
record alone (its layer died); appended without a lock, drained under ``lock``. Never rebound: each record's
callback is its ``append``."""

_on_dead: Callable[[LayerRecord], None] = changes.append
"""A layer died (its record's weakref callback, on any thread, under any lock): queue the record for ``drain``.

``deque.append`` itself, no Python function: the collector runs it without a frame of ours, so it cannot meet the
recursion limit in a frame of ours, and a signal or asynchronous exception pending when the layer dies is raised in
the model's code afterwards, where a Python callback would have run it and CPython dropped it as unraisable (the
record lost with it)."""
CHANGED = -2
"""``LayerRecord.reported`` of a layer whose tensors may have changed at the same size (new tensor objects of a static
layer, any other layer's update): its measure is handed over even when equal, so a sample re-weighs its storages."""
changed: dict[int, LayerRecord] = {}
"""The records whose changes ``drain`` applied since the last ``take_changed`` (by ``id``): what a sample re-weighs."""
BACKLOG = 50_000
"""Changes waiting for a ``drain`` (a few MB) beyond which a model thread drains some itself, if ``lock`` is free."""
STEP = 64
"""Changes a model thread drains at most at once (tens of microseconds)."""
_draining = False
_active = False
_broken: str | None = None
_late: tuple[str, type] | None = None
"""A failure whose failure path could not run: (site, error type), reported by the next ``broken()``."""
_graph_depth = 0
_logged_sites: set[str] = set()
_is_compiling: Callable[[], bool] = torch.compiler.is_compiling
_get = dict.get
_Tensor = torch.Tensor
_modes_on = torch._C._is_torch_function_mode_enabled
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
    changes.clear()
    changed.clear()
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


def drain(most: int | None = None) -> None:
    """Apply the changes handed over (bytes measured, layers that died) to the counters, in order, holding ``lock``;
    at most ``most`` when given. Not re-entered (a finaliser that updates a cache, run by the collector during a
    drain, leaves its change queued)."""
    global _draining
    if _draining:
        return
    _draining = True
    try:
        left = -1 if most is None else most
        while changes and left:
            left -= 1
            change = changes.popleft()
            if isinstance(change, tuple):
                record, size = change
            else:
                record, size = change, GONE
            counted = record.bytes
            if counted == GONE:
                continue
            changed[id(record)] = record
            if size == GONE:
                record.bytes = GONE
                record.owner.live -= counted
                _remove_dead_weakref(records, record.key)
                if record.state_key:
                    _remove_dead_weakref(states, record.state_key)
            elif size != counted:
                record.bytes = size
                record.owner.add(size - counted)
    finally:
        _draining = False


def take_changed() -> dict[int, LayerRecord]:
    """The records ``drain`` changed since the last call (holding ``lock``); starts a new set."""
    global changed
    taken = changed
    changed = {}
    return taken


def _try_drain() -> None:
    """Drain what waits if no one holds ``lock`` (on a model thread: never waits)."""
    if _draining or not lock.acquire(False):
        return
    try:
        drain(None if len(changes) <= STEP else STEP)
    finally:
        lock.release()


def hand_over(record: LayerRecord, size: int) -> None:
    """``record``'s layer holds ``size`` bytes now: queue the change for ``drain`` (never waits)."""
    if size != record.reported:
        record.reported = size
        changes.append((record, size))
        if record.owner.on_change is not None or len(changes) > BACKLOG:
            _try_drain()


def register(layer: object, owner: OwnerState) -> LayerRecord:
    """Attribute ``layer`` to ``owner`` from now on."""
    plan = plan_for(type(layer))
    record = LayerRecord(layer, _on_dead)
    record.owner = owner
    record.bytes = record.reported = 0
    record.plan = plan
    record.key = key = id(layer)
    record.key_ref = None
    record.twin = record.copies = None
    record.fresh = plan.fresh
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
    record.fresh = source.fresh = False
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
        hand_over(record, measure(layer, record.plan, shared(record)))
        if record.copies:
            remeasure(record.copies)


def measure_new_layers(owner: OwnerState) -> None:
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
        hand_over(record, size)


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
    measure_new_layers(target)
    return record


def layer_changed(layer: Any) -> None:
    """After a layer was initialised or updated: attribute it, count the call, re-measure it (never waits)."""
    owner = running.get()
    record = _get(records, id(layer))
    if record is None or record() is not layer:
        if owner is None:
            record = discovered(layer)
            if record is None:
                return
        else:
            record = register(layer, owner)
    if owner is not None:
        if owner.counted_call != owner.call_number:
            owner.counted_call = owner.call_number
            owner.cache_calls += 1
        if record.owner is not owner:
            owner.wrote_held = record.owner
        if _graph_depth:
            owner.graph = "a cache was used during a CUDA graph capture; replays are not observable"
        if owner.pending:
            measure_new_layers(owner)
    try:
        if record.fresh:  # tensors the update just made, or window views into them: their size, or their base's
            state = layer.__dict__
            keys = _get(state, "keys")
            values = _get(state, "values")
            if type(keys) is _Tensor and type(values) is _Tensor and not _modes_on():
                base = keys._base
                size = 0 if keys.is_meta else (keys if base is None else base).nbytes
                if values is not keys:
                    base = values._base
                    size += 0 if values.is_meta else (values if base is None else base).nbytes
            else:
                size = pair_bytes(keys, values)
        elif record.plan.unknown is not None:
            return
        elif record.twin is not None:
            size = measure(layer, record.plan, shared(record))
            record.reported = CHANGED
        elif record.plan.static:
            state = record.plan.state(layer)
            keys = _get(state, "keys")
            values = _get(state, "values")
            key_ref = record.key_ref
            if key_ref is not None and key_ref() is keys and record.value_ref() is values:
                return
            size = pair_bytes(keys, values)
            record.key_ref, record.value_ref = same_tensors(keys, values)
            record.reported = CHANGED
        else:
            size = measure(layer, record.plan)
            record.reported = CHANGED
    except Unweighable as problem:
        record.owner.unknown = str(problem)
        return
    if size != record.reported:  # ``hand_over``, inlined
        record.reported = size
        changes.append((record, size))
        if record.owner.on_change is not None or len(changes) > BACKLOG:
            _try_drain()
    if record.copies:
        remeasure(record.copies)


def created(layer: object, state: object = None) -> None:
    """A layer was constructed or copied (from ``state``) while an owner runs: attribute it now, measure it later
    (never waits)."""
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
    def hooked(*args: Any, **kwargs: Any) -> Any:
        global _active, _late
        result = function(*args, **kwargs) if kwargs else function(*args)
        if _active:
            try:
                if not _is_compiling():
                    layer_changed(args[0] if args else kwargs["self"])
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
        measure_new_layers(owner)


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


def _forked() -> None:
    """In a child forked while another thread held ``lock`` or drained: a fresh lock, and counters recomputed from
    the records where a drain was cut short (that thread does not exist here)."""
    global lock, _draining
    lock = threading.RLock()
    if _draining:
        _draining = False
        for owner in {id(record.owner): record.owner for record in list(records.values())}.values():
            owner.live = 0
        for record in list(records.values()):
            if record.bytes > 0:
                record.owner.live += record.bytes


os.register_at_fork(after_in_child=_forked)
