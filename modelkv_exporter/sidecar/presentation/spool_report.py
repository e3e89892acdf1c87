"""The spool as people read it, built once: one neutral report per engine, for the page and for ``inspect``.

``spool_report`` reads a ``SpoolView`` and returns what both renderers show, in plain text: per engine
(``EngineReport``) its facts, status and findings (``sidecar.attention``), its post-mortem, its declarations,
observed owners and discovered owners as ``Table``s, what discovery covered, its owners' bars, its memory by part
(``sidecar.breakdown``), its growth since baseline by part (``sidecar.growth``) and what to give vLLM
(``sidecar.prescription``); for the spool, the engines that need attention (those that died first), no engine at
all, rejected files and the files left unread. Nothing here is escaped or laid out: the page
(``presentation.page``) escapes and draws, ``inspect`` (``cli.reports``) makes the snapshot's text visible and fits
it to a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from modelkv_exporter.contract.sizes import human_bytes, signed_bytes
from modelkv_exporter.contract.snapshot import DiscoveredOwner, DiscoveryStatus, Snapshot
from modelkv_exporter.contract.thresholds import UNDER_REPORT_TOLERANCE
from modelkv_exporter.sidecar.attention import (
    Finding,
    Status,
    findings,
    holds_over,
    holds_undeclared,
    no_engine,
    owner_name,
    status,
)
from modelkv_exporter.sidecar.breakdown import Breakdown, breakdown
from modelkv_exporter.sidecar.discovered import exported_discovery, reports_discovery
from modelkv_exporter.sidecar.growth import growth
from modelkv_exporter.sidecar.label_values import GROWTH_SOURCES
from modelkv_exporter.sidecar.post_mortem import post_mortem, post_mortem_lines
from modelkv_exporter.sidecar.prescription import Prescription, prescription
from modelkv_exporter.sidecar.presentation.wording import (
    ABSENT,
    DISCOVERED_LEGEND,
    GEOMETRY_LEGEND,
    OBSERVED_LEGEND,
    geometry_words,
    layout_words,
)
from modelkv_exporter.sidecar.reader.decode import SnapshotError
from modelkv_exporter.sidecar.reader.scan import SpoolScan
from modelkv_exporter.sidecar.reader.state import EngineState, SpoolView, died

ColumnKind = Literal["name", "text", "figure", "note"]


class Column(NamedTuple):
    """A table's column: its heading, and what its cells hold.

    ``name``: a module path or a cache's name, which a narrow terminal cuts where a part ends; ``text``: a short
    value, kept whole; ``figure``: a number or a size, aligned right; ``note``: longer text, which the page shows as a
    column and a terminal as a line under the table."""

    name: str
    kind: ColumnKind = "text"


@dataclass(frozen=True)
class Table:
    """Rows of plain-text cells under ``columns``; the first ``key`` cells of a row name it."""

    columns: tuple[Column, ...]
    rows: tuple[tuple[str, ...], ...]
    legend: str = ""
    key: int = 1


class Bar(NamedTuple):
    """One bar of an owner's picture: which figure, its bytes (None: not measured, said in ``note``), and whether it
    is memory no declaration accounts for."""

    kind: str
    value: int | None
    not_declared: bool = False
    note: str = ""


class Fact(NamedTuple):
    """One thing a report says in passing, and whether it calls for attention."""

    text: str
    urgent: bool = False


@dataclass(frozen=True)
class EngineReport:
    """One engine as the page and ``inspect`` show it."""

    engine_id: str
    state: EngineState
    who: str
    """Its model and stage, in one line."""
    facts: tuple[tuple[str, str], ...]
    """What identifies it and how it runs: (name, value), only those the snapshot holds."""
    status: Status
    findings: tuple[Finding, ...]
    post_mortem: tuple[tuple[str, str], ...]
    """Why it died and its memory then, as (heading, text); empty unless it died."""
    declarations: Table
    declared_peak: int
    dropped: tuple[str, ...]
    owners: Table
    """Per declaring owner, what it declares beside what its caches held, or why they were not observed."""
    bars: tuple[tuple[str, tuple[Bar, ...]], ...]
    """Per owner, declared, observed and discovered bytes: the owners table and the discovered one as bars."""
    discovered: Table
    discovery: tuple[Fact, ...]
    """What discovery covered and left out, or why it is off; empty from a writer that does not report it."""
    parts: Breakdown | None
    growth: tuple[str, ...] | None
    """Growth since baseline by part (``wording.GROWTH_COLUMNS``); None before a baseline, or when not judged."""
    measured_growth: tuple[str, int] | None
    """The measurement growth since baseline is taken from, and its bytes."""
    prescription: Prescription
    age: float
    """Seconds since its last heartbeat."""
    detailed: bool
    """Whether its details are worth a section: not forgotten, and not ended unless it died."""


@dataclass(frozen=True)
class SpoolReport:
    """The spool as people read it: every engine's report, and what is wrong with the spool itself."""

    engines: tuple[EngineReport, ...]
    no_engine: Finding | None
    rejected: tuple[tuple[str, SnapshotError], ...]
    """Every file the scan could not use: its name and why (``client_detail`` words it for an HTTP client)."""
    skipped: int
    unreadable: bool

    @property
    def troubled(self) -> list[EngineReport]:
        """The engines with findings, those that died first, in the spool's order otherwise."""
        return sorted((e for e in self.engines if e.findings), key=lambda e: not e.post_mortem)

    @property
    def ok(self) -> int:
        """How many engines are ok."""
        return sum(e.status is Status.OK for e in self.engines)


def measured_growth(snapshot: Snapshot) -> tuple[str, int] | None:
    """The source and bytes of growth since the baseline, from the same sources the rules prefer."""
    current, baseline = snapshot.measured.current, snapshot.measured.baseline
    if current is None or baseline is None:
        return None
    for source in GROWTH_SOURCES:
        if source in current.values and source in baseline.values:
            return source, current.values[source] - baseline.values[source]
    return None


def _part(value: int | None) -> str:
    return ABSENT if value is None else signed_bytes(value, "+")


def growth_cells(snapshot: Snapshot, state: EngineState) -> tuple[str, ...] | None:
    """One engine's growth since baseline by part and the alert it would raise; None before its baseline, or for an
    engine whose figures are not judged (ended, forgotten)."""
    judged = growth(snapshot)
    if judged is None or state not in (EngineState.EXPORTED, EngineState.STALE):
        return None
    if state is EngineState.STALE:
        alert = "none: a stale engine's figures are not exported"
    elif judged.over_threshold:
        alert = "ModelKVUndeclaredMemoryGrowth, once this lasts 15 minutes"
    else:
        alert = "none"
    unexplained = judged.unexplained
    return (
        _part(judged.live_tensors),
        _part(judged.non_torch),
        _part(judged.resident if judged.resident_measured else None),
        human_bytes(judged.explained),
        ABSENT if unexplained is None else human_bytes(unexplained),
        alert,
    )


def _facts(snapshot: Snapshot) -> tuple[tuple[str, str], ...]:
    engine, settings, sleep = snapshot.engine, snapshot.settings, snapshot.sleep
    facts = [
        ("model", engine.model_label),
        ("stage", engine.stage_label),
        ("architecture", engine.architecture),
        ("ranks", engine.ranks_label),
        ("device", engine.device),
        ("writer", snapshot.writer),
        ("max_num_seqs", ABSENT if settings.max_num_seqs is None else str(settings.max_num_seqs)),
        ("paged KV", None if settings.paged_kv_bytes is None else human_bytes(settings.paged_kv_bytes)),
        (
            "paged KV reserved",
            None if settings.paged_kv_reserved_bytes is None else human_bytes(settings.paged_kv_reserved_bytes),
        ),
        ("sleep", sleep.summary if sleep is not None else None),
    ]
    return tuple((name, str(value)) for name, value in facts if value)


def _declarations(snapshot: Snapshot) -> Table:
    columns = (
        Column("owner", "name"), Column("cache", "name"), Column("scope"), Column("rows"), Column("per row", "figure"),
        Column("declared peak", "figure"), Column("geometry"), Column("class", "note"), Column("capacity", "note"),
        Column("notes", "note"),
    )  # fmt: skip
    rows = tuple(
        (
            owner_name(d.owner), d.name, d.scope, f"{d.rows} = {d.row_count}", human_bytes(d.bytes_per_row),
            human_bytes(d.peak_bytes), geometry_words(d), d.owner_class, d.capacity_source,
            "; ".join(n for n in (d.rows_reason, d.allocation_note) if n),
        )
        for d in snapshot.declarations
    )  # fmt: skip
    return Table(columns, rows, GEOMETRY_LEGEND, key=2)


def _observed_note(declared: int, peak: int) -> str:
    if declared and peak > declared:
        return holds_over(peak, declared)
    if not declared and peak:
        return holds_undeclared(peak)
    return "within its declaration" if declared else ""


def _owners(snapshot: Snapshot) -> tuple[Table, list[tuple[str, list[Bar]]]]:
    """The owners table, and each owner's declared and observed bars."""
    columns = (
        Column("owner", "name"), Column("declared peak", "figure"), Column("observed peak", "figure"),
        Column("recent peak", "figure"), Column("live", "figure"), Column("calls", "figure"), Column("", "note"),
    )  # fmt: skip
    rows, bars = [], []
    for owner, observation in snapshot.owners().items():
        declared = snapshot.declared_peak_of(owner)
        if observation is None or not observation.available:
            why = "the engine does not report it" if observation is None else observation.reason or ""
            rows.append(
                (owner_name(owner), human_bytes(declared), ABSENT, ABSENT, ABSENT, ABSENT, f"not observed: {why}")
            )
            bars.append((owner, [Bar("declared", declared), Bar("observed", None, note="not observed")]))
            continue
        peak = observation.peak_bytes or 0
        rows.append(
            (
                owner_name(owner), human_bytes(declared), human_bytes(peak),
                human_bytes(observation.recent_peak_bytes or 0), human_bytes(observation.live_bytes or 0),
                f"{observation.cache_calls}/{observation.calls}", _observed_note(declared, peak),
            )
        )  # fmt: skip
        over = peak > UNDER_REPORT_TOLERANCE * declared
        ratio = f"{peak / declared:.2f}×" if over and declared else ""
        bars.append((owner, [Bar("declared", declared), Bar("observed", peak, over, ratio)]))
    return Table(columns, tuple(rows), OBSERVED_LEGEND), bars


def _discovered(found: tuple[DiscoveredOwner, ...]) -> Table:
    columns = (
        Column("discovered owner", "name"), Column("found by"), Column("declares"), Column("peak", "figure"),
        Column("recent peak", "figure"), Column("live", "figure"), Column("layout seen"), Column("class", "note"),
    )  # fmt: skip
    rows = tuple(
        (
            owner_name(d.owner), d.found_by, "also" if d.declares else "nothing", human_bytes(d.peak_bytes),
            human_bytes(d.recent_peak_bytes), human_bytes(d.live_bytes), layout_words(d.layout), d.owner_class,
        )
        for d in found
    )  # fmt: skip
    return Table(columns, rows, DISCOVERED_LEGEND)


def discovery_facts(status: DiscoveryStatus | None, omitted: int) -> tuple[Fact, ...]:
    """What discovery covered and left out, in order (or why it is off); ``omitted``: discovered owners past the
    exporter's ``--sidecar-max-discovered-owners``."""
    facts = []
    if status is not None:
        if not status.enabled:
            return (Fact(f"discovery is off: {status.reason or 'no reason given'}"),)
        if status.census_seconds is not None:
            facts.append(
                Fact(
                    f"discovery: last census {status.modules} modules, {status.objects} objects in "
                    f"{status.census_seconds * 1000:.1f} ms"
                )
            )
        if status.budget_exhausted:
            facts.append(Fact(f"the census ran out of its {status.budget_exhausted} budget", urgent=True))
        if status.owners_below_floor:
            facts.append(Fact(f"{status.owners_below_floor} owners below the engine's size floor"))
        if status.owners_over_budget:
            facts.append(Fact(f"{status.owners_over_budget} past the engine's owner budget"))
    if omitted:
        facts.append(Fact(f"{omitted} past this exporter's --sidecar-max-discovered-owners, not exported"))
    return tuple(facts)


def engine_report(
    snapshot: Snapshot, state: EngineState, now: float, *, max_discovered: int | None = None, ended_too: bool = False
) -> EngineReport:
    """One engine's report at ``now``; at most ``max_discovered`` discovered owners (the ones /metrics exports; None:
    all). ``ended_too``: judge an ended engine's findings too (a report of a finished run), not only its death."""
    found = findings(snapshot, state, now, ended_too=ended_too)
    exported = exported_discovery(snapshot, len(snapshot.discovered) if max_discovered is None else max_discovered)
    owners, bars = _owners(snapshot)
    for d in exported.owners:
        note = "beyond its declared caches" if d.declares else "not declared"
        match = next((b for owner, b in bars if owner == d.owner), None)
        if match is None:
            bars.append((d.owner, match := []))
        match.append(Bar("discovered", d.peak_bytes, True, note))
    dead = post_mortem(snapshot, state)
    engine = snapshot.engine
    return EngineReport(
        engine_id=engine.engine_id,
        state=state,
        who=" · ".join(v for v in (engine.model_label, engine.stage_label) if v),
        facts=_facts(snapshot),
        status=status(state, found),
        findings=tuple(found),
        post_mortem=() if dead is None else tuple(post_mortem_lines(dead)),
        declarations=_declarations(snapshot),
        declared_peak=snapshot.declared_peak_bytes,
        dropped=tuple(
            f"{d.count} of {owner_name(d.owner)} ({d.owner_class}), {d.reason}: {d.error}"
            for d in snapshot.dropped_declarations or ()
        ),
        owners=owners,
        bars=tuple((owner, tuple(b)) for owner, b in bars),
        discovered=_discovered(exported.owners),
        discovery=discovery_facts(snapshot.discovery, exported.omitted) if reports_discovery(snapshot) else (),
        parts=breakdown(snapshot),
        growth=growth_cells(snapshot, state),
        measured_growth=measured_growth(snapshot),
        prescription=prescription(snapshot),
        age=max(now - snapshot.heartbeat_at, 0),
        detailed=state is not EngineState.FORGOTTEN and (state is not EngineState.ENDED or died(snapshot)),
    )


def rejected_files(scan: SpoolScan) -> tuple[tuple[str, SnapshotError], ...]:
    """Every file ``scan`` could not use, with why."""
    return tuple((e.file_name, e.error) for e in scan.entries if e.error is not None)


def spool_report(
    view: SpoolView, *, max_discovered: int | None = None, ended_too: bool = False, up_for: float | None = None
) -> SpoolReport:
    """The report of one view of the spool (``engine_report`` for each engine's arguments); ``up_for``: seconds the
    exporter has run, where known, for the finding that no engine publishes."""
    return SpoolReport(
        engines=tuple(
            engine_report(item.snapshot, item.state, view.now, max_discovered=max_discovered, ended_too=ended_too)
            for item in view.usable
        ),
        no_engine=no_engine(view, up_for),
        rejected=rejected_files(view.scan),
        skipped=view.scan.skipped,
        unreadable=bool(view.scan.error),
    )
