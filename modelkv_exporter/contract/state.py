"""What state each spool file's engine is in: the one place it is decided.

Metrics, the JSON API, the landing page and ``inspect`` all classify a scan with
``classify`` and name states with ``EngineState``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from modelkv_exporter.contract.scan import SpoolEntry, SpoolScan
from modelkv_exporter.contract.snapshot import Snapshot

DEFAULT_STALE_AFTER_SECONDS = 30.0
DEFAULT_FORGET_AFTER_SECONDS = 3600.0


class EngineState(str, Enum):
    """The state of one spool file's engine. The values are label values of ``modelkv_exporter_spool_files``."""

    EXPORTED = "exported"
    """Fresh: every figure of the engine is exported."""

    STALE = "stale"
    """Missed its heartbeats: only its identity and ``modelkv_engine_up 0`` are exported."""

    ENDED = "ended"
    """Marked ended by its engine at shutdown: nothing is exported."""

    REJECTED = "rejected"
    """The file could not be used (see its reason): nothing is exported."""

    FORGOTTEN = "forgotten"
    """Stale or ended for longer than ``forget_after``: nothing is exported, the file is only counted."""


def is_stale(snapshot: Snapshot, now: float, stale_after: float) -> bool:
    """Stale when a beating snapshot missed its heartbeats: older than max(stale_after, 3 intervals).

    A one-shot snapshot (no heartbeat interval) promises no heartbeat and is never stale.
    """
    interval = snapshot.heartbeat_interval_seconds
    if interval is None:
        return False
    return now - snapshot.heartbeat_at > max(stale_after, 3 * interval)


def engine_state(snapshot: Snapshot, now: float, stale_after: float, forget_after: float = 0.0) -> EngineState:
    """``ENDED``, ``STALE``, ``EXPORTED`` or ``FORGOTTEN`` for a usable snapshot.

    An ended or stale snapshot whose heartbeat is older than ``forget_after`` seconds (0: never) is
    forgotten. A fresh one never is, however long ``forget_after``: a one-shot snapshot is never stale.
    """
    if snapshot.ended:
        state = EngineState.ENDED
    elif is_stale(snapshot, now, stale_after):
        state = EngineState.STALE
    else:
        return EngineState.EXPORTED
    if forget_after > 0 and now - snapshot.heartbeat_at > forget_after:
        return EngineState.FORGOTTEN
    return state


def snapshot_age(snapshot: Snapshot, now: float) -> float:
    """Seconds since the snapshot's heartbeat, never negative."""
    return max(0.0, now - snapshot.heartbeat_at)


@dataclass(frozen=True)
class Classified:
    """One spool entry and its state."""

    entry: SpoolEntry
    state: EngineState

    @property
    def snapshot(self) -> Snapshot:
        """The entry's snapshot (only for states other than ``REJECTED``)."""
        assert self.entry.snapshot is not None
        return self.entry.snapshot


@dataclass(frozen=True)
class SpoolView:
    """A scan with every entry classified at one instant."""

    scan: SpoolScan
    now: float
    entries: tuple[Classified, ...]

    @property
    def counts(self) -> Mapping[EngineState, int]:
        """Files by state, every state present (0 when none)."""
        counts = dict.fromkeys(EngineState, 0)
        for item in self.entries:
            counts[item.state] += 1
        return counts

    @property
    def exported(self) -> list[Classified]:
        """Engines whose figures are exported: fresh and stale ones (stale ones show only identity)."""
        return [item for item in self.entries if item.state in (EngineState.EXPORTED, EngineState.STALE)]

    @property
    def usable(self) -> list[Classified]:
        """Every entry holding a snapshot, ended and forgotten ones included."""
        return [item for item in self.entries if item.state is not EngineState.REJECTED]

    @property
    def rejected(self) -> list[SpoolEntry]:
        """Entries that could not be used."""
        return [item.entry for item in self.entries if item.state is EngineState.REJECTED]


def classify(scan: SpoolScan, now: float, stale_after: float, forget_after: float = 0.0) -> SpoolView:
    """Every entry of ``scan`` with its state at ``now``; ``forget_after`` 0 never forgets."""
    return SpoolView(
        scan,
        now,
        tuple(
            Classified(entry, EngineState.REJECTED)
            if entry.snapshot is None
            else Classified(entry, engine_state(entry.snapshot, now, stale_after, forget_after))
            for entry in scan.entries
        ),
    )
