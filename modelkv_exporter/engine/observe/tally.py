"""A sample's figures kept between samples: each owner's distinct storages, re-weighed only where layers changed.

An owner's live bytes are the bytes of the distinct storages behind its live layers (a storage two layers share counts
once). ``Tally`` keeps them: per storage, its bytes and how many of the owner's layers hold it, and their sum. What
each layer added is remembered (``entries``), so a layer is taken out and weighed again alone: a sample (``refresh``)
re-weighs the layers whose changes ``hooks.drain`` applied since the last one (``hooks.changed``: updates, new
layers, deaths) and ``ROLL`` more in turn, which finds what changed outside the hooked methods (a ``crop``, an
attribute set by hand) within ``live layers / ROLL`` samples. Its work grows with the changes, not the live layers.

The tallies and the changes handed over are the process's, not one model's: with two models in a process, two
heartbeats sample, and the changes one takes over must be weighed before either reads a figure. ``sampling`` makes
them take turns (a heartbeat's lock: no model thread ever takes it). A child forked while a sample ran rebuilds every
tally from its live layers at its first sample.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from modelkv_exporter.engine.observe import hooks
from modelkv_exporter.engine.observe.layers import StorageKey, Unweighable, measure, storages, structure_problem
from modelkv_exporter.engine.observe.records import LayerRecord, OwnerState, Tally

ROLL = 256
"""Layers a sample re-weighs beyond those that changed, in turn through every live layer."""
CHUNK = 64
"""Layers re-weighed per hold of ``hooks.lock`` and of the GIL (a few microseconds each)."""

sampling = threading.Lock()
"""Held by a sample from ``refresh`` until its figures are read (``Observer.sample``); taken by heartbeats only."""

entries: dict[int, tuple[LayerRecord, OwnerState, dict[StorageKey, int]]] = {}
"""By ``id`` of a layer's record: the record, the owner whose tally counts its storages, and those storages."""
_roll: list[LayerRecord] = []
_cursor = 0
_rebuild = False


def reset() -> None:
    """Forget every layer's storages (when the observer is removed)."""
    global _cursor
    entries.clear()
    _roll.clear()
    _cursor = 0


def _forked() -> None:
    """In a child forked while another thread sampled: a fresh ``sampling`` lock, and every tally rebuilt at the next
    sample (the changes that thread had taken over are lost with it)."""
    global sampling, _rebuild
    sampling = threading.Lock()
    _rebuild = True


os.register_at_fork(after_in_child=_forked)


def _rolling() -> list[LayerRecord]:
    """The next ``ROLL`` live layers' records, in turn (the list of every record is taken again once gone through)."""
    global _roll, _cursor
    if _cursor >= len(_roll):
        with hooks.lock:
            _roll = list(hooks.records.values())
        _cursor = 0
    part = _roll[_cursor : _cursor + ROLL]
    _cursor += ROLL
    return part


def in_chunks(records: list[LayerRecord], each: Callable[[LayerRecord], None]) -> None:
    """``each`` of ``records`` holding ``hooks.lock`` for ``CHUNK`` of them at a time, after the changes the model
    handed over before them (``hooks.drain``), handing the GIL over between chunks (``hooks.lock`` is reentrant: a
    caller that holds it holds it throughout)."""
    for start in range(0, len(records), CHUNK):
        if start:
            time.sleep(0)
        with hooks.lock:
            hooks.drain()
            for record in records[start : start + CHUNK]:
                each(record)


def refresh(observing: bool) -> None:
    """Bring every owner's tally up to date: re-weigh the layers that changed since the last call and ``ROLL`` more
    (``in_chunks``)."""
    global _rebuild
    with hooks.lock:
        hooks.drain()
        changed = hooks.take_changed()
        if _rebuild:
            _rebuild = False
            reset()
            for record in hooks.records.values():
                record.owner.tally = Tally()
                changed.setdefault(id(record), record)
    for record in _rolling():
        changed.setdefault(id(record), record)
    in_chunks(list(changed.values()), lambda record: reweigh(record, observing))


def reweigh(record: LayerRecord, observing: bool) -> None:
    """Take ``record``'s layer out of the tally it was counted in and weigh it into its owner's now (holding
    ``hooks.lock``). A dead layer is only taken out."""
    key = id(record)
    entry = entries.pop(key, None)
    if entry is not None:
        entry[1].tally.remove(key, entry[2])
    state = record.owner
    weighed = weigh_layer(record, observing)
    if isinstance(weighed, str):
        entries[key] = (record, state, {})
        state.tally.failures[key] = weighed
    elif weighed is not None:
        entries[key] = (record, state, weighed)
        state.tally.add(weighed)


def weigh_layer(record: LayerRecord, observing: bool) -> dict[StorageKey, int] | str | None:
    """A live layer's storages (``layers.storages``), its counted bytes corrected where they drifted outside
    ``update`` (holding ``hooks.lock``); why it could not be read; or None: dead, or of a class whose keeping is not
    understood (its owner's ``unknown`` then says why)."""
    layer = record()
    if layer is None or record.bytes == hooks.GONE:
        return None
    state = record.owner
    plan = record.plan
    if plan.unknown is not None:
        state.unknown = plan.unknown
        return None
    try:
        problem = None if plan.vetted else structure_problem(layer, plan)
        if problem is not None:
            plan.unknown = state.unknown = problem
            return None
        mine = storages(layer, plan)
    except Unweighable as error:
        state.unknown = str(error)
        return None
    except Exception as error:
        return f"a cache layer could not be read: {type(error).__name__}: {error}"
    size = sum(mine.values()) if record.twin is None else measure(layer, plan, hooks.shared(record))
    delta = size - record.bytes
    if observing and delta:
        record.bytes = record.reported = size
        state.add(delta)
    return mine


def raise_high_waters(state: OwnerState, live: int) -> None:
    """Raise the owner's high-waters to ``live`` bytes, found by a sample (taking ``hooks.lock``)."""
    with hooks.lock:
        state.high_water = max(state.high_water, live)
        state.interval_high_water = max(state.interval_high_water, live)


def figures(state: OwnerState, observing: bool) -> tuple[int, str | None]:
    """An owner's live bytes now (its distinct storages) and why they cannot be trusted, if they cannot; raises its
    high-waters to them (``refresh`` first)."""
    tally: Tally = state.tally
    live = tally.live
    failure = tally.failure()
    if observing:
        raise_high_waters(state, live)
    return live, failure
