"""What about an engine needs a person's attention, judged from its snapshot and state alone.

The landing page leads with these findings. They mirror the alerts an operator would get from
the rules (``deploy/prometheus/modelkv-rules.yaml``), with the figures one snapshot holds: an
owner observed above its declaration (``ModelKVDeclarationUnderReports``, same tolerance), a
module holding cache memory it does not declare, declarations the engine dropped
(``ModelKVDeclarationsDropped``), an owner called many times whose declared cache was never used
(``ModelKVDeclaredCacheUnused``, over the engine's lifetime rather than 30 minutes), and a stale
heartbeat (``ModelKVSnapshotStale``, without its 5 minutes). Details are plain text; the page
escapes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.thresholds import UNDER_REPORT_TOLERANCE, UNUSED_MIN_CALLS
from modelkv_exporter.sidecar.reader.state import EngineState
from modelkv_exporter.sidecar.sizes import human_bytes
from modelkv_exporter.sidecar.vocabulary import ROOT_OWNER

NAMED = 3
"""Owners named per finding; the rest are counted, so a finding stays short whatever the snapshot holds."""


class Concern(str, Enum):
    """Why an engine needs attention, in the order the page lists them."""

    STALE = "stale"
    UNDER_REPORTS = "under-reports"
    UNDECLARED = "undeclared cache"
    DROPPED = "dropped declarations"
    UNUSED = "declared cache unused"


class Status(str, Enum):
    """An engine's status on the landing page."""

    OK = "ok"
    ATTENTION = "attention"
    STALE = "stale"
    ENDED = "ended"
    FORGOTTEN = "forgotten"


@dataclass(frozen=True)
class Finding:
    """One concern about one engine, with what it is about in plain text."""

    concern: Concern
    detail: str


def _owner(name: str) -> str:
    return name or ROOT_OWNER


def _listed(items: Sequence[str]) -> str:
    named = "; ".join(items[:NAMED])
    return named if len(items) <= NAMED else f"{named}; and {len(items) - NAMED} more"


def _under_reports(snapshot: Snapshot) -> list[str]:
    found = []
    for owner, observation in snapshot.owners().items():
        if observation is None or not observation.available or not observation.peak_bytes:
            continue
        declared, peak = snapshot.declared_peak_of(owner), observation.peak_bytes
        if not declared:
            found.append(f"{_owner(owner)} holds {human_bytes(peak)} in caches it does not declare")
        elif peak > UNDER_REPORT_TOLERANCE * declared:
            found.append(
                f"{_owner(owner)} holds {peak / declared:.2f}× its declaration "
                f"({human_bytes(peak)} observed, {human_bytes(declared)} declared)"
            )
    return found


def _unused(snapshot: Snapshot) -> list[str]:
    found = []
    for owner, observation in snapshot.owners().items():
        if observation is None or not observation.available or not snapshot.declared_peak_of(owner):
            continue
        if (observation.calls or 0) >= UNUSED_MIN_CALLS and observation.cache_calls == 0:
            found.append(f"{_owner(owner)} was called {observation.calls} times and never used a cache")
    return found


def findings(snapshot: Snapshot, state: EngineState, now: float) -> list[Finding]:
    """Everything about an exported or stale engine that needs attention; nothing for an ended or forgotten one."""
    if state not in (EngineState.EXPORTED, EngineState.STALE):
        return []
    found: list[Finding] = []
    if state is EngineState.STALE:
        age = max(now - snapshot.heartbeat_at, 0)
        found.append(Finding(Concern.STALE, f"no heartbeat for {age:.0f} s; its figures are no longer exported"))
    if under := _under_reports(snapshot):
        found.append(Finding(Concern.UNDER_REPORTS, _listed(under)))
    undeclared = [
        f"{_owner(d.owner)} holds {human_bytes(d.peak_bytes)} {'beyond its declared caches' if d.declares else 'it does not declare'}"
        for d in snapshot.discovered
    ]
    if undeclared:
        found.append(Finding(Concern.UNDECLARED, _listed(undeclared)))
    if snapshot.dropped_count:
        dropped = [f"{d.count} of {_owner(d.owner)} ({d.reason})" for d in snapshot.dropped_declarations or ()]
        found.append(Finding(Concern.DROPPED, _listed(dropped)))
    if unused := _unused(snapshot):
        found.append(Finding(Concern.UNUSED, _listed(unused)))
    return found


def status(state: EngineState, found: Sequence[Finding]) -> Status:
    """One word for the engines table: stale before attention, attention before ok."""
    if state is EngineState.ENDED:
        return Status.ENDED
    if state is EngineState.FORGOTTEN:
        return Status.FORGOTTEN
    if state is EngineState.STALE:
        return Status.STALE
    return Status.ATTENTION if found else Status.OK
