"""What state each spool file's engine is in: the one place it is decided.

Metrics, the JSON API, the landing page and ``inspect`` all classify a scan with
``classify`` and name states with ``EngineState``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path

from modelkv_exporter.contract.setting_values import non_negative_float
from modelkv_exporter.contract.settings import setting
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.spool import alive_file_name, writer_alive
from modelkv_exporter.contract.vocabulary import EndReason
from modelkv_exporter.sidecar.reader.scan import SpoolEntry, SpoolScan

CLOCK_SKEW_SECONDS = 10.0
"""How far in the future a heartbeat may be before its engine is called stale (engine and sidecar share a node's clock)."""


class EngineState(str, Enum):
    """The state of one spool file's engine. The values are label values of ``modelkv_exporter_spool_files``."""

    EXPORTED = "exported"
    """Fresh: every figure of the engine is exported."""

    STALE = "stale"
    """Missed its heartbeats: only its identity and ``modelkv_engine_up 0`` are exported."""

    VANISHED = "vanished"
    """Stale, and no process holds its liveness lock: killed without ending (SIGKILL, the kernel's OOM killer).
    Exported as a stale engine, with its end (``reason="vanished"``) and its last figures as a post-mortem."""

    ENDED = "ended"
    """Marked ended by its engine: nothing of it is exported as a live engine. One that ended for a reason other
    than ``shutdown`` (``end.reason``) exports its end and its memory then (a post-mortem) until forgotten."""

    REJECTED = "rejected"
    """The file could not be used (see its reason): nothing is exported."""

    FORGOTTEN = "forgotten"
    """Stale or ended for longer than ``forget_after``: nothing is exported, the file is only counted."""


@dataclass(frozen=True)
class Staleness:
    """When an engine that stopped beating is stale, and when it is forgotten; each a setting."""

    stale_after: float = setting(
        30.0,
        non_negative_float,
        "Seconds without a heartbeat after which an engine is stale (at least 3 of its heartbeat intervals).",
    )
    forget_after: float = setting(
        3600.0,
        non_negative_float,
        "Seconds after its last heartbeat at which a stale or ended engine's file is forgotten: no longer exported, "
        'only counted (modelkv_exporter_spool_files{state="forgotten"}); 0 never forgets.',
    )

    def classify(self, scan: SpoolScan, now: float, alive: Liveness | None = None) -> SpoolView:
        """Every entry of ``scan`` with its state at ``now`` (``classify`` with these thresholds); ``alive`` tells
        vanished engines from stale ones (``spool_liveness``)."""
        return classify(scan, now, self.stale_after, self.forget_after, alive)


def stale_at(snapshot: Snapshot, stale_after: float) -> float:
    """When a beating snapshot goes stale: older than max(stale_after, 3 intervals) (infinity for a one-shot one).

    A one-shot snapshot (no heartbeat interval) promises no heartbeat and is never stale.
    """
    interval = snapshot.heartbeat_interval_seconds
    if interval is None:
        return math.inf
    return snapshot.heartbeat_at + max(stale_after, 3 * interval)


def trusted_from(snapshot: Snapshot) -> float:
    """When the snapshot's heartbeat stops being in the future by more than ``CLOCK_SKEW_SECONDS``.

    Before then no clock vouches for it, so its engine is stale whatever its interval: a heartbeat
    ten years ahead would otherwise keep an engine fresh for ten years.
    """
    return snapshot.heartbeat_at - CLOCK_SKEW_SECONDS


def is_stale(snapshot: Snapshot, now: float, stale_after: float) -> bool:
    """Stale when a beating snapshot missed its heartbeats (see ``stale_at``), or its heartbeat is in the future."""
    return now > stale_at(snapshot, stale_after) or now < trusted_from(snapshot)


def forget_at(snapshot: Snapshot, forget_after: float) -> float:
    """When an ended or stale snapshot is forgotten: ``forget_after`` seconds after its heartbeat (0: never)."""
    return snapshot.heartbeat_at + forget_after if forget_after > 0 else math.inf


Liveness = Callable[[Snapshot], bool | None]
"""Whether a stale snapshot's writer still holds its liveness lock (``contract.spool.writer_alive``): True, False
(gone), None (cannot tell)."""


def spool_liveness(directory: Path) -> Liveness:
    """Whether a snapshot's writer in the spool ``directory`` holds its liveness lock (``<engine>.alive``): one open
    and one non-blocking flock each time it is asked."""

    def alive(snapshot: Snapshot) -> bool | None:
        return writer_alive(directory / alive_file_name(snapshot.engine.engine_id))

    return alive


def engine_state(snapshot: Snapshot, now: float, stale_after: float, forget_after: float) -> EngineState:
    """``ENDED``, ``STALE``, ``EXPORTED`` or ``FORGOTTEN`` for a usable snapshot (``classify`` tells ``VANISHED``
    from ``STALE``).

    An ended or stale snapshot whose heartbeat is older than ``forget_after`` seconds (0: never) is
    forgotten. A fresh one never is, however long ``forget_after``: a one-shot snapshot is never stale.
    """
    if snapshot.ended:
        state = EngineState.ENDED
    elif is_stale(snapshot, now, stale_after):
        state = EngineState.STALE
    else:
        return EngineState.EXPORTED
    return EngineState.FORGOTTEN if now > forget_at(snapshot, forget_after) else state


def died(snapshot: Snapshot) -> bool:
    """Whether an ended snapshot ended for a reason other than ``shutdown`` (``end.reason``); an older writer's end,
    which gives none, is a shutdown."""
    return snapshot.end is not None and snapshot.end.reason != EndReason.SHUTDOWN.value


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
    """A scan with every entry classified at one instant.

    ``until`` is the first instant at which a state of this classification could change
    without the spool changing (an exported engine going stale, a stale or ended one being
    forgotten): until then the same classification holds for any later ``now``.
    """

    scan: SpoolScan
    now: float
    entries: tuple[Classified, ...]
    until: float = math.inf
    liveness: tuple[tuple[str, bool | None], ...] = ()
    """What the liveness of each stale (or vanished) file read, by file name: the classification holds only while
    they read the same."""

    def at(self, now: float) -> SpoolView:
        """The same classification at a later instant before ``until`` (what was derived from it kept)."""
        later = object.__new__(SpoolView)
        later.__dict__.update(self.__dict__, now=now)
        return later

    @cached_property
    def counts(self) -> Mapping[EngineState, int]:
        """Files by state, every state present (0 when none)."""
        counts = dict.fromkeys(EngineState, 0)
        for item in self.entries:
            counts[item.state] += 1
        counts[EngineState.REJECTED] += self.scan.skipped
        return counts

    @cached_property
    def exported(self) -> list[Classified]:
        """Engines whose figures are exported: fresh and stale ones (stale and vanished ones show only identity)."""
        return [item for item in self.entries if item.state in LIVE_STATES]

    @cached_property
    def shown(self) -> list[Classified]:
        """Engines /metrics shows anything of: the exported ones, and the ended ones that died (``died``), not yet
        forgotten, whose end alone it shows."""
        return [
            item
            for item in self.entries
            if item.state in LIVE_STATES or (item.state is EngineState.ENDED and died(item.snapshot))
        ]

    @property
    def usable(self) -> list[Classified]:
        """Every entry holding a snapshot, ended ones included."""
        return [item for item in self.entries if item.state is not EngineState.REJECTED]

    @property
    def rejected(self) -> list[SpoolEntry]:
        """Entries that could not be used."""
        return [item.entry for item in self.entries if item.state is EngineState.REJECTED]


LIVE_STATES = (EngineState.EXPORTED, EngineState.STALE, EngineState.VANISHED)
"""States of an engine exported as a live one (fresh, or stale with its identity only)."""
STALE_STATES = (EngineState.STALE, EngineState.VANISHED)
"""States of an engine that missed its heartbeats and is not forgotten."""


def classify(
    scan: SpoolScan, now: float, stale_after: float, forget_after: float, alive: Liveness | None = None
) -> SpoolView:
    """Every entry of ``scan`` with its state at ``now``; ``forget_after`` 0 never forgets. ``alive`` is asked once
    per stale file (one open and flock of its liveness file) to tell a vanished engine from a hung one."""
    entries = []
    until = math.inf
    liveness: list[tuple[str, bool | None]] = []
    for entry in scan.entries:
        snapshot = entry.snapshot
        if snapshot is None:
            entries.append(Classified(entry, EngineState.REJECTED))
            continue
        state = engine_state(snapshot, now, stale_after, forget_after)
        if state is EngineState.STALE and alive is not None:
            answer = alive(snapshot)
            liveness.append((entry.file_name, answer))
            if answer is False:
                state = EngineState.VANISHED
        if state is EngineState.EXPORTED:
            until = min(until, stale_at(snapshot, stale_after))
        elif state is not EngineState.FORGOTTEN:
            until = min(until, forget_at(snapshot, forget_after))
            if now < trusted_from(snapshot):
                until = min(until, trusted_from(snapshot))
        entries.append(Classified(entry, state))
    return SpoolView(scan, now, tuple(entries), until, tuple(liveness))
