"""The observer's bookkeeping: one record per observed owner, one weak record per cache layer."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from modelkv_exporter.engine.observe.layers import Plan, StorageKey


class Tally:
    """An owner's distinct storages as its layers were last weighed (``observe.tally``): per storage its bytes and how
    many layers hold it, their sum, the devices, and the layers that could not be read."""

    __slots__ = ("sizes", "holders", "live", "devices", "failures")

    def __init__(self) -> None:
        self.sizes: dict[StorageKey, int] = {}
        self.holders: dict[StorageKey, int] = {}
        self.live = 0
        """Bytes of the distinct storages."""
        self.devices: dict[str, int] = {}
        """Storages by device."""
        self.failures: dict[int, str] = {}
        """Why a layer could not be read, by ``id`` of its record."""

    def add(self, found: dict[StorageKey, int]) -> None:
        """One layer's storages (``layers.storages``) join. A storage already held at the same address with another
        size was freed and its address reused since a layer holding it was last weighed: the newest weighing is the
        storage there now."""
        holders = self.holders
        sizes = self.sizes
        for key, size in found.items():
            held = holders.get(key, 0)
            holders[key] = held + 1
            if not held:
                sizes[key] = size
                self.live += size
                self.devices[key[0]] = self.devices.get(key[0], 0) + 1
            elif sizes[key] != size:
                self.live += size - sizes[key]
                sizes[key] = size

    def remove(self, record: int, found: dict[StorageKey, int]) -> None:
        """One layer's storages, as ``add`` was given them, leave (and its failure, by ``id`` of its record)."""
        self.failures.pop(record, None)
        holders = self.holders
        for key in found:
            held = holders[key] - 1
            if held:
                holders[key] = held
                continue
            del holders[key]
            self.live -= self.sizes.pop(key)
            left = self.devices[key[0]] - 1
            if left:
                self.devices[key[0]] = left
            else:
                del self.devices[key[0]]

    def failure(self) -> str | None:
        """Why the figure cannot be trusted: a layer that could not be read, or storages on several devices."""
        for text in self.failures.values():
            return text
        if len(self.devices) > 1:
            return f"cache tensors on several devices {sorted(self.devices)}: offloaded caches are not observed"
        return None


class OwnerState:
    """Counters of one owner; touched on the model's hot path, so plain slots."""

    __slots__ = (
        "path",
        "class_name",
        "owner_ref",
        "live",
        "high_water",
        "interval_high_water",
        "calls",
        "call_number",
        "counted_call",
        "cache_calls",
        "pending",
        "unknown",
        "graph",
        "on_change",
        "wrote_held",
        "tally",
    )

    def __init__(self, path: str, owner: object) -> None:
        self.path = path
        self.class_name = type(owner).__name__
        try:
            self.owner_ref: Callable[[], object | None] = weakref.ref(owner)
        except TypeError:
            self.owner_ref = lambda: owner
        self.live = 0
        """Bytes held now by the owner's live layers, kept incrementally."""
        self.high_water = 0
        self.interval_high_water = 0
        self.calls = 0
        self.call_number = 0
        self.counted_call = -1
        """The call last counted in ``cache_calls`` (so a call is counted once)."""
        self.cache_calls = 0
        self.pending: list[LayerRecord] = []
        """Layers created in this call that no update has measured yet (deep copies, built caches)."""
        self.unknown: str | None = None
        self.graph: str | None = None
        self.wrote_held: OwnerState | None = None
        """The owner holding a cache layer this owner updated while running (a cache counts once, for the owner
        that holds it: the one its layer was first seen with); None: it updated only its own."""
        self.tally = Tally()
        """The distinct storages of its live layers as last weighed (``observe.tally``)."""
        self.on_change: Callable[[OwnerState], None] | None = None
        """Called after the live bytes changed (by ``hooks.drain``, holding ``hooks.lock``: on the model's thread
        right after its change where that lock is free); None in an engine. For ``modelkv_exporter.testing``, which
        records what the owner's layers held at each call's peak."""

    def add(self, delta: int) -> None:
        """Move the live bytes by ``delta`` and raise the high-waters with them."""
        live = self.live + delta
        self.live = live
        if live > self.interval_high_water:
            self.interval_high_water = live
            if live > self.high_water:
                self.high_water = live
        if self.on_change is not None:
            self.on_change(self)

    def count_cache_call(self) -> None:
        """Count the current call as one that used a cache (once per call)."""
        if self.counted_call != self.call_number:
            self.counted_call = self.call_number
            self.cache_calls += 1


class LayerRecord(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to one cache layer, with its owner and the bytes counted for it.

    Built by ``weakref.ref``'s own constructor, attributes set after, which keeps registering cheap.
    ``bytes`` is what the owner's counters hold for the layer (changed by ``hooks.drain`` only, holding
    ``hooks.lock``); ``reported`` what a model thread last measured and handed over (changed by the hooks only).
    ``key_ref``/``value_ref`` point at the tensors last measured (static plans only); ``group`` is set
    by discovery only: the ``id`` of the cache the layer belongs to, where it could be told. ``twin`` is
    the record of the layer this one is a shallow copy of (``copy.copy``: the same tensor objects, which
    count there, not here), ``copies`` the records of its own shallow copies. ``fresh``: an update is measured by
    the hooks' fast path (its class's plan is ``fresh``, and it has no twin or copies).
    """

    __slots__ = (
        "owner",
        "bytes",
        "reported",
        "plan",
        "key",
        "key_ref",
        "value_ref",
        "group",
        "state_key",
        "twin",
        "copies",
        "fresh",
    )
    owner: OwnerState
    bytes: int
    reported: int
    plan: Plan
    key: int
    key_ref: Callable[[], Any] | None
    value_ref: Callable[[], Any]
    group: int
    state_key: int
    twin: LayerRecord | None
    copies: list[LayerRecord] | None
    fresh: bool
