"""Plain-text reports of a spool for people: ``inspect`` and ``plan``, at most ``MAX_WIDTH`` columns wide."""

from __future__ import annotations

import re
import shutil
import textwrap
from collections.abc import Sequence

from modelkv_exporter.contract.sizes import human_bytes, signed_bytes
from modelkv_exporter.contract.snapshot import Declaration, DiscoveredOwner, Snapshot
from modelkv_exporter.sidecar.attention import (
    CLI,
    Concern,
    Finding,
    findings,
    no_engine,
    over_declaration,
    undeclared_text,
)
from modelkv_exporter.sidecar.breakdown import breakdown, headroom_words, whole_and_missing
from modelkv_exporter.sidecar.capacity import Correction, Demand
from modelkv_exporter.sidecar.discovered import discovery_facts, discovery_running, reports_discovery
from modelkv_exporter.sidecar.http.public import visible
from modelkv_exporter.sidecar.post_mortem import post_mortem, post_mortem_lines
from modelkv_exporter.sidecar.prescription import PRESCRIPTION_LEGEND, estimate_text, prescription, prescription_text
from modelkv_exporter.sidecar.reader.state import EngineState, SpoolView
from modelkv_exporter.sidecar.vocabulary import ROOT_OWNER

_NUMERIC = re.compile(r"\d+(\.\d+)?( [KMGT]?i?B)?")
_BREAK = re.compile(r"[./_\-:\s]+")
MAX_WIDTH = 120
MIN_WIDTH = 60
MIN_COLUMN = 8
GEOMETRY_LEGEND = "geometry: layers x kv_heads x head_dim x positions per row"
FITS_LEGEND = "the largest max_num_seqs whose peak fits in --cache-memory"
FROM_LEGEND = (
    "from: declared, the declarations alone; observed, the declarations of an owner whose caches were observed "
    "holding more, scaled up to what was observed, and caches the engine holds but does not declare, added as "
    "fixed bytes (see the warnings)"
)
OBSERVED_LEGEND = (
    "observed: the most an owner's transformers caches held at once since the engine started; recent: within "
    "its last sample interval; calls: those that used a cache / all calls into the owner"
)

DISCOVERED_LEGEND = (
    "discovered: modules that hold cache memory they do not declare; found by cache_layer (a transformers cache "
    "built while no declaring owner ran) or census (tensors the module holds that it did not hold after "
    "initialisation); layout: layers x kv_heads x head_dim x positions a row, element type, rows"
)


def report_width() -> int:
    """The terminal's width, kept between ``MIN_WIDTH`` and ``MAX_WIDTH`` (``MAX_WIDTH`` when not a terminal)."""
    return max(MIN_WIDTH, min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns))


def abbreviate(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its head and its tail joined by an ellipsis, cut where a word or
    a path's part ends (at ``.``, ``/``, ``_``, ``-``, ``:`` or a space).

    The tail, which tells module paths and engine ids apart, gets two thirds of the room, the head
    the rest; where no trailing part fits, the head alone is kept, and a text with no such place to
    cut at all is cut in the middle.
    """
    if len(text) <= width:
        return text
    if width < 2:
        return text[:width]
    room = width - 1
    cuts = [m.end() for m in _BREAK.finditer(text) if m.end() < len(text)]
    heads = [0, *cuts]
    head = max(i for i in heads if i <= room // 3)
    tail = next((j for j in cuts if j > head and len(text) - j <= room - head), None)
    if tail is None:
        head = 0
        tail = next((j for j in cuts if len(text) - j <= room), None)
    if tail is None and cuts and cuts[0] <= room:
        return text[: max(i for i in cuts if i <= room)] + "…"
    if tail is None:
        half = room // 2
        return text[:half] + "…" + text[len(text) - (room - half) :]
    head = max(i for i in heads if i <= min(tail, room - (len(text) - tail)))
    return text[:head] + "…" + text[tail:]


def _column_widths(
    headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None, narrow: Sequence[int]
) -> list[int]:
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=False)]
    if width is None:
        return widths
    floors = [min(w, MIN_COLUMN) if i in narrow else w for i, w in enumerate(widths)]
    while sum(widths) + 2 * (len(widths) - 1) > width:
        shrinkable = [i for i, w in enumerate(widths) if w > floors[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None = None, narrow: Sequence[int] = ()
) -> str:
    """Left-aligned columns; numbers and sizes right-aligned.

    With ``width``, the widest of the ``narrow`` columns (free text: names, ids) are narrowed
    until a line fits, and text longer than its column is cut in the middle with an ellipsis.
    """
    widths = _column_widths(headers, rows, width, narrow)

    def line(cells: Sequence[str]) -> str:
        cut = [abbreviate(c, w) for c, w in zip(cells, widths, strict=True)]
        return "  ".join(
            c.rjust(w) if _NUMERIC.fullmatch(c) else c.ljust(w) for c, w in zip(cut, widths, strict=True)
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _wrapped(text: str, width: int, indent: str = "") -> str:
    return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent + "    ")


def _max_num_seqs(snapshot: Snapshot) -> str:
    value = snapshot.settings.max_num_seqs
    return "none" if value is None else str(value)


def _engine_heading(snapshot: Snapshot, state: EngineState) -> str:
    who = snapshot.engine
    bits = [f"engine {who.engine_id} [{state.value}]", f"model {who.model_label or '?'}"]
    if who.stage_label:
        bits.append(f"stage {who.stage_label}")
    if who.ranks_label:
        bits.append(who.ranks_label)
    if who.device:
        bits.append(f"device {who.device}")
    bits.append(f"max_num_seqs {_max_num_seqs(snapshot)}")
    if snapshot.settings.paged_kv_bytes is not None:
        bits.append(f"paged KV {human_bytes(snapshot.settings.paged_kv_bytes)}")
    if snapshot.settings.paged_kv_reserved_bytes is not None:
        bits.append(f"paged KV reserved {human_bytes(snapshot.settings.paged_kv_reserved_bytes)}")
    if snapshot.sleep is not None and snapshot.sleep.summary:
        bits.append(snapshot.sleep.summary)
    return ", ".join(bits)


def _declaration_details(d: Declaration) -> str:
    details = [f"class {d.owner_class}", f"capacity {d.capacity_source}"]
    if d.rows_reason:
        details.append(f"rows: {d.rows_reason}")
    if d.allocation_note:
        details.append(f"note: {d.allocation_note}")
    return f"{d.owner or ROOT_OWNER} / {d.name}: " + "; ".join(details)


def _observed(snapshot: Snapshot, width: int) -> list[str]:
    """Per owner: declared beside observed in a table, then why an owner is not observed, or how far over it is."""
    rows, notes = [], []
    for owner, observation in snapshot.owners().items():
        name = owner or ROOT_OWNER
        declared = snapshot.declared_peak_of(owner)
        if observation is None or not observation.available:
            rows.append([name, human_bytes(declared), "-", "-", "-", "-"])
            why = "the engine does not report it" if observation is None else observation.reason
            notes.append(_wrapped(f"{name}: not observed: {why}", width, "  "))
            continue
        peak = observation.peak_bytes or 0
        rows.append(
            [
                name,
                human_bytes(declared),
                human_bytes(peak),
                human_bytes(observation.recent_peak_bytes or 0),
                human_bytes(observation.live_bytes or 0),
                f"{observation.cache_calls}/{observation.calls}",
            ]
        )
        if peak > declared:
            over = over_declaration(owner, peak, declared) if declared else undeclared_text(owner, "", peak)
            notes.append(_wrapped(over, width, "  "))
    if not rows:
        return []
    headers = ["owner", "declared", "observed", "recent", "live", "calls"]
    return [table(headers, rows, width, narrow=(0,)), *notes]


def _parts(snapshot: Snapshot, width: int) -> list[str]:
    """Where the engine's memory goes: each known part, its bytes and share of the process figure, then the unknown."""
    parts = breakdown(snapshot)
    if parts is None:
        return []
    whole, missing = whole_and_missing(parts)
    total = parts.total
    rows = [
        [name, signed_bytes(value, minus="-"), f"{value / total:.1%}" if total else "-"]
        for name, value in parts.parts.items()
    ]
    lines = [_wrapped(f"memory by part of {whole}{missing}{headroom_words(parts)}", width)]
    if rows:
        lines.append(table(["part", "bytes", "share"], rows, width, narrow=(0,)))
    return lines


def _rejected_lines(view: SpoolView, width: int) -> list[str]:
    """Every file the scan could not use, with its reason, and how many it did not read."""
    lines = [
        _wrapped(f"{e.file_name}: {e.error.reason.value}: {e.error.detail}", width, "  ")
        for e in view.rejected
        if e.error
    ]
    if view.scan.skipped:
        lines.append(
            f"  {view.scan.skipped} more not read: over the spool's file or byte budget (--max-spool-files, "
            "--max-spool-bytes)"
        )
    return ["rejected files:", *lines] if lines else []


def _layout(found: DiscoveredOwner) -> str:
    layout = found.layout
    if layout is None:
        return "-"
    rows = f"{layout.rows} row" + ("" if layout.rows == 1 else "s")
    return f"{layout.layers}x{layout.kv_heads}x{layout.head_dim}x{layout.positions} {visible(layout.dtype)}, {rows}"


def _discovery_status(snapshot: Snapshot) -> str:
    status = snapshot.discovery
    if status is None:
        return ""
    if not status.enabled:
        return f"discovery off: {visible(status.reason or 'no reason given')}"
    facts = [fact.text for fact in discovery_facts(status, visible)]
    return "discovery: " + "; ".join(facts) if facts else ""


def _discovered(snapshot: Snapshot, width: int) -> list[str]:
    """Every owner the engine discovered, what it held and the layout seen, then what discovery covered (what to do
    about them is in the summary). Nothing from a writer that does not report discovery; text from the snapshot
    with its unprintable characters shown as escapes."""
    if not reports_discovery(snapshot):
        return []
    parts = []
    found = snapshot.discovered if discovery_running(snapshot) else ()
    if found:
        headers = ["discovered", "found by", "declares", "peak", "recent", "live", "layout"]
        rows = [
            [
                visible(d.owner or ROOT_OWNER), visible(d.found_by), "also" if d.declares else "nothing",
                human_bytes(d.peak_bytes),
                human_bytes(d.recent_peak_bytes), human_bytes(d.live_bytes), _layout(d),
            ]
            for d in found
        ]  # fmt: skip
        parts.append(table(headers, rows, width, narrow=(0, 1, 6)))
    status = _discovery_status(snapshot)
    if status:
        parts.append(_wrapped(status, width))
    return parts


def finding_lines(finding: Finding, spool: str, cli: str, width: int, indent: str = "    ") -> list[str]:
    """A finding's next step, one wrapped line each: the fix, the command to run, the runbook section."""
    step = finding.step
    return [
        _wrapped(f"fix: {step.fix}", width, indent),
        *command_lines("run:", step.command_line(spool, cli), f"({step.shows})", width, indent),
        _wrapped(f"runbook: {step.alert}, {step.runbook()}", width, indent),
    ]


def command_lines(label: str, command: str, note: str, width: int, indent: str = "") -> list[str]:
    """A command to paste, then its note (beside it where it fits).

    A command is never wrapped inside a word (a path breaks at its hyphens otherwise): one longer than
    the line is split between its arguments with a shell continuation, so it still pastes as it is.
    """
    words, lines = visible(command).split(" "), [f"{indent}{label}"]
    for word in words:
        if len(lines[-1]) + 1 + len(word) + 2 > width and lines[-1].strip() not in (label, ""):
            lines[-1] += " \\"
            lines.append(indent + "    " + word)
        else:
            lines[-1] += " " + word
    if len(lines[-1]) + 1 + len(note) <= width:
        lines[-1] += " " + note
        return lines
    return [*lines, _wrapped(note, width, indent + "    ")]


def attention_summary(view: SpoolView, spool: str, cli: str = CLI, width: int = MAX_WIDTH) -> list[str]:
    """How many engines the spool holds and which have problems; per problem, in the landing page's words, what is
    wrong (every owner: a report names them all) and what to do next. Ended engines are judged on what they left (a
    finished run is worth reading)."""
    judged = [(item, findings(item.snapshot, item.state, view.now, ended_too=True)) for item in view.usable]
    troubled = [(item, found) for item, found in judged if found]
    troubled.sort(key=lambda pair: post_mortem(pair[0].snapshot, pair[0].state) is None)
    nobody = no_engine(view)
    if nobody is not None:
        return [
            _wrapped(f"summary: {nobody.concern.value}: {nobody.detail}", width),
            *finding_lines(nobody, spool, cli, width),
            "",
        ]
    if not judged:
        return []
    count = f"{len(judged)} engine{'s' if len(judged) != 1 else ''}"
    if not troubled:
        return [f"summary: {count}, none with a problem", ""]
    lines = [f"summary: {count}, {len(troubled)} with problems:"]
    for item, found in troubled:
        engine = item.snapshot.engine
        who = ", ".join(v for v in (engine.model_label, engine.stage_label, item.state.value) if v)
        for finding in found:
            problems = "; ".join(p.text for p in finding.problems)
            what = visible(f"{engine.engine_id} ({who}): {finding.concern.value}: {problems}")
            lines.append(_wrapped(what, width, "  "))
            lines += finding_lines(finding, spool, cli, width)
    return [*lines, ""]


def inspect_report(view: SpoolView, width: int = MAX_WIDTH, spool: str = "DIR", cli: str = CLI) -> str:
    """Every engine's declarations in full, then every rejected file; no line wider than ``width``.

    The table holds what compares across declarations; long text (owner class, capacity source,
    reasons, notes) follows it, one wrapped line per declaration. Then, per owner, what it declares
    beside what its caches were observed to hold, and why an owner is not observed; then the owners the
    engine discovered holding caches, and what each that declares nothing should declare; then where the
    engine's memory goes, part by part (``sidecar.breakdown``).
    """
    if not view.scan.ok:
        return _wrapped(f"cannot read the spool: {view.scan.error}", width) + "\n"
    parts: list[str] = attention_summary(view, spool, cli, width)
    headers = ["owner", "cache", "scope", "rows", "n", "dtype", "geometry", "per row", "peak"]
    for item in view.usable:
        snapshot = item.snapshot
        parts.append(_wrapped(_engine_heading(snapshot, item.state), width))
        dead = post_mortem(snapshot, item.state)
        if dead is not None:
            parts.append("post-mortem:")
            parts += [_wrapped(f"{heading}: {text}", width, "  ") for heading, text in post_mortem_lines(dead)]
        rows = [
            [
                d.owner or ROOT_OWNER, d.name, d.scope, d.rows, str(d.row_count), d.dtype,
                f"{d.layers}x{d.kv_heads}x{d.head_dim}x{d.physical_capacity_positions}",
                human_bytes(d.bytes_per_row), human_bytes(d.peak_bytes),
            ]
            for d in snapshot.declarations
        ]  # fmt: skip
        if rows:
            parts.append(table(headers, rows, width, narrow=(0, 1, 5)))
            parts.append(f"declared peak: {human_bytes(snapshot.declared_peak_bytes)}")
            parts += [_wrapped(_declaration_details(d), width, "  ") for d in snapshot.declarations]
        else:
            parts.append("(no declarations)")
        for dropped in snapshot.dropped_declarations or ():
            owner = dropped.owner or ROOT_OWNER
            text = f"dropped: {dropped.count} of {owner} ({dropped.owner_class}), {dropped.reason}: {dropped.error}"
            parts.append(_wrapped(text, width))
        parts += _observed(snapshot, width)
        parts += _discovered(snapshot, width)
        parts += _parts(snapshot, width)
        parts.append("")
    if any(item.snapshot.declarations for item in view.usable):
        parts += [GEOMETRY_LEGEND, ""]
    if any(item.snapshot.owners() for item in view.usable):
        parts += [_wrapped(OBSERVED_LEGEND, width), ""]
    if any(discovery_running(item.snapshot) and item.snapshot.discovered for item in view.usable):
        parts += [_wrapped(DISCOVERED_LEGEND, width), ""]
    parts += _rejected_lines(view, width)
    if not parts:
        parts.append("no snapshots in the spool")
    return "\n".join(parts).rstrip() + "\n"


def _fit_cell(demand: Demand, cache_memory: int) -> str:
    fit = demand.fit(cache_memory)
    if fit.max_num_seqs is None:
        return "any (fixed only)"
    if fit.fixed_bytes > cache_memory:
        return f"none: fixed {human_bytes(fit.fixed_bytes)}"
    if fit.max_num_seqs == 0:
        return f"none: one takes {human_bytes(demand.peak_at(1))}"
    return str(fit.max_num_seqs)


def _correction_note(engine_id: str, snapshot: Snapshot, correction: Correction) -> str:
    """A correction in the landing page's words, then what ``plan`` made of it."""
    at = f"max_num_seqs {_max_num_seqs(snapshot)}"
    if correction.ratio is None:
        what = undeclared_text(correction.owner, "", correction.observed_bytes)
        return (
            f"warning: {engine_id}: {Concern.UNDECLARED.value}: {what}; counted as fixed bytes (how they grow with "
            "max_num_seqs is unknown)"
        )
    ratio = float(correction.ratio)
    what = over_declaration(correction.owner, correction.observed_bytes, correction.declared_bytes)
    return (
        f"warning: {engine_id}: {Concern.UNDER_REPORTS.value}: {what} at {at}; its figures are scaled up by {ratio:.2f}"
    )


def _undeclared_note(engine_id: str, found: DiscoveredOwner) -> str:
    """A discovered owner in the landing page's words, then what ``plan`` made of it."""
    what = undeclared_text(found.owner, found.owner_class, found.peak_bytes, found.declares)
    return (
        f"warning: {engine_id}: {Concern.UNDECLARED.value}: {visible(what)}; counted as fixed bytes (how they grow "
        "with max_num_seqs is unknown)"
    )


STATE_NOTES = {
    EngineState.STALE: "stale: the engine missed its heartbeats; planned from its last snapshot",
    EngineState.VANISHED: "vanished: the engine was killed without ending its snapshot; planned from its last one",
    EngineState.ENDED: "ended: the engine shut down or died; planned from the snapshot it left",
    EngineState.FORGOTTEN: "forgotten: stale or ended long ago (--forget-after); planned from the snapshot it left",
}
"""What ``plan`` says under its table about engines that are not running now."""


def plan_report(
    view: SpoolView,
    max_num_seqs: int | None,
    cache_memory: int | None,
    width: int = MAX_WIDTH,
    spool: str = "DIR",
    cli: str = CLI,
) -> str:
    """Each engine's peak now, at ``max_num_seqs`` and per sequence, and the largest max_num_seqs whose peak fits
    in ``cache_memory``.

    Every engine in the spool is planned, whatever its state, from its declarations; an owner
    observed holding more than it declares has its figures scaled up, and every cache the engine
    discovered undeclared is added as fixed bytes (``Demand.expected``); a warning under the table
    names each, in the landing page's words, with the command that says what to declare. Rejected
    files are listed below.
    """
    if not view.scan.ok:
        return _wrapped(f"cannot read the spool: {view.scan.error}", width) + "\n"
    headers = ["engine", "stage", "state", "now", "peak now"]
    if max_num_seqs is not None:
        headers.append(f"peak at {max_num_seqs}")
    headers += ["per seq", "from"]
    if cache_memory is not None:
        headers.append(f"fits {human_bytes(cache_memory)}")
    rows, warnings = [], []
    for item in view.usable:
        snapshot, engine_id = item.snapshot, item.snapshot.engine.engine_id
        demand = Demand.expected(snapshot)
        now = snapshot.settings.max_num_seqs
        row = [engine_id, snapshot.engine.stage_label, item.state.value, "—" if now is None else str(now)]
        row.append(human_bytes(demand.peak_at(now or 1)))
        if max_num_seqs is not None:
            row.append(human_bytes(demand.peak_at(max_num_seqs)))
        row += [
            human_bytes(demand.per_sequence_bytes),
            "observed" if demand.corrections or demand.undeclared else "declared",
        ]
        if cache_memory is not None:
            row.append(_fit_cell(demand, cache_memory))
        rows.append(row)
        warnings += [_wrapped(_correction_note(engine_id, snapshot, c), width, "") for c in demand.corrections]
        warnings += [_wrapped(_undeclared_note(engine_id, d), width, "") for d in demand.undeclared]
    parts = []
    if cache_memory is not None:
        parts.append(
            _wrapped(f"cache memory: {cache_memory} bytes ({human_bytes(cache_memory)}); fits: {FITS_LEGEND}", width)
        )
    parts.append(table(headers, rows, width, narrow=(0, 1)) if rows else "no engine snapshots in the spool")
    if warnings:
        check = command_lines(
            "what to declare instead:",
            f"{cli} check {spool}",
            "(each owner's verdict and the declaration to write)",
            width,
        )
        parts += [_wrapped(FROM_LEGEND, width), *warnings, *check]
    parts += _prescription_lines(view, width)
    states = {item.state for item in view.usable}
    parts += [_wrapped(note, width) for state, note in STATE_NOTES.items() if state in states]
    parts += _rejected_lines(view, width)
    return "\n".join(parts) + "\n"


def _prescription_lines(view: SpoolView, width: int) -> list[str]:
    """What to give vLLM, per engine: the flag to paste and how it was computed (``sidecar.prescription``)."""
    if not view.usable:
        return []
    lines = [_wrapped(f"what to give vLLM at each engine's own max_num_seqs ({PRESCRIPTION_LEGEND}):", width)]
    for item in view.usable:
        found = prescription(item.snapshot)
        engine_id = item.snapshot.engine.engine_id
        lines.append(_wrapped(f"- {engine_id}: {prescription_text(found)}", width, ""))
        if found.flag is not None:
            lines.append(f"  {found.flag}")
        estimate = estimate_text(found)
        if estimate:
            lines.append(_wrapped(f"  vLLM's start-up estimate: {estimate}", width, ""))
    return lines
