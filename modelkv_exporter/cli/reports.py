"""Plain-text reports of a spool for people: ``inspect`` (``presentation.spool_report``'s report, as the landing page
shows it) and ``plan``, at most ``MAX_WIDTH`` columns wide (``text_layout``)."""

from __future__ import annotations

from collections.abc import Sequence

from modelkv_exporter.cli.text_layout import MAX_WIDTH, command_lines, table, wrapped
from modelkv_exporter.contract.sizes import human_bytes, signed_bytes
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.sidecar.attention import CLI, Concern, Finding, over_declaration, undeclared_text
from modelkv_exporter.sidecar.breakdown import headroom_words, whole_and_missing
from modelkv_exporter.sidecar.capacity import Correction, Demand
from modelkv_exporter.sidecar.prescription import (
    PRESCRIPTION_LEGEND,
    Prescription,
    estimate_text,
    prescription,
    prescription_text,
)
from modelkv_exporter.sidecar.presentation.safe_text import printable
from modelkv_exporter.sidecar.presentation.spool_report import (
    EngineReport,
    SpoolReport,
    Table,
    rejected_files,
    spool_report,
)
from modelkv_exporter.sidecar.presentation.wording import GROWTH_COLUMNS, SKIPPED, plural
from modelkv_exporter.sidecar.reader.decode import SnapshotError
from modelkv_exporter.sidecar.reader.state import EngineState, SpoolView

FITS_LEGEND = "the largest max_num_seqs whose peak fits in --cache-memory"
FROM_LEGEND = (
    "from: declared, the declarations alone; observed, the declarations of an owner whose caches were observed "
    "holding more, scaled up to what was observed, and caches the engine holds but does not declare, added as "
    "fixed bytes (see the warnings)"
)


def table_lines(report_table: Table, width: int) -> list[str]:
    """A report's table: its short columns laid out, then each row's notes on a line of their own; nothing without
    rows."""
    if not report_table.rows:
        return []
    columns = report_table.columns
    shown = [i for i, c in enumerate(columns) if c.kind != "note"]
    notes = [i for i, c in enumerate(columns) if c.kind == "note"]
    narrow = [j for j, i in enumerate(shown) if columns[i].kind == "name"]
    rows = [[printable(row[i]) for i in shown] for row in report_table.rows]
    lines = [table([columns[i].name for i in shown], rows, width, narrow)]
    for row in report_table.rows:
        said = [f"{columns[i].name} {row[i]}".strip() for i in notes if row[i]]
        if said:
            lines.append(wrapped(printable(" / ".join(row[: report_table.key]) + ": " + "; ".join(said)), width, "  "))
    return lines


def _parts(engine: EngineReport, width: int) -> list[str]:
    """Where the engine's memory goes: each known part, its bytes and share of the process figure, then the unknown."""
    parts = engine.parts
    if parts is None:
        return []
    whole, missing = whole_and_missing(parts)
    total = parts.total
    rows = [
        [name, signed_bytes(value, minus="-"), f"{value / total:.1%}" if total else "-"]
        for name, value in parts.parts.items()
    ]
    lines = [wrapped(f"memory by part of {whole}{missing}{headroom_words(parts)}", width)]
    if rows:
        lines.append(table(["part", "bytes", "share"], rows, width, narrow=(0,)))
    return lines


def _growth(engine: EngineReport, width: int) -> list[str]:
    if engine.growth is None:
        return []
    words = ", ".join(f"{name} {value}" for name, value in zip(GROWTH_COLUMNS, engine.growth, strict=True))
    return [wrapped(f"growth since baseline: {words}", width)]


def prescription_lines(found: Prescription, lead: str, width: int) -> list[str]:
    """A prescription after ``lead``: how it was computed, the flag to paste, and where vLLM's estimate was off."""
    lines = [wrapped(f"{lead}{prescription_text(found)}", width, "")]
    if found.flag is not None:
        lines.append(f"  {found.flag}")
    estimate = estimate_text(found)
    if estimate:
        lines.append(wrapped(f"  vLLM's start-up estimate: {estimate}", width, ""))
    return lines


def _engine_lines(engine: EngineReport, width: int) -> list[str]:
    """One engine in the order the page shows it: who it is, how it died, its declarations, owners, discovered
    owners, memory by part, growth and what to give vLLM."""
    facts = [f"{name} {value}" for name, value in engine.facts]
    lines = [wrapped(printable(", ".join([f"engine {engine.engine_id} [{engine.state.value}]", *facts])), width)]
    if engine.post_mortem:
        lines.append("post-mortem:")
        lines += [wrapped(printable(f"{heading}: {text}"), width, "  ") for heading, text in engine.post_mortem]
    declared = table_lines(engine.declarations, width)
    if declared:
        lines += [*declared[:1], f"declared peak: {human_bytes(engine.declared_peak)}", *declared[1:]]
    else:
        lines.append("(no declarations)")
    lines += [wrapped(printable(f"dropped: {text}"), width) for text in engine.dropped]
    lines += table_lines(engine.owners, width)
    lines += table_lines(engine.discovered, width)
    if engine.discovery:
        lines.append(wrapped(printable("; ".join(fact.text for fact in engine.discovery)), width))
    return [
        *lines,
        *_parts(engine, width),
        *_growth(engine, width),
        *prescription_lines(engine.prescription, "what to give vLLM: ", width),
    ]


def rejected_lines(
    rejected: Sequence[tuple[str, SnapshotError]], skipped: int, width: int, mark: str = ""
) -> list[str]:
    """Every file the scan could not use, with its reason, and how many it did not read, each after ``mark``."""
    lines = [wrapped(printable(f"{mark}{name}: {e.reason.value}: {e.detail}"), width, "  ") for name, e in rejected]
    if skipped:
        lines.append(wrapped(f"{mark}{skipped} {SKIPPED}", width, "  "))
    return ["rejected files:", *lines] if lines else []


def finding_lines(finding: Finding, spool: str, cli: str, width: int, indent: str = "    ") -> list[str]:
    """A finding's next step, one wrapped line each: the fix, the command to run, the runbook section."""
    step = finding.step
    return [
        wrapped(f"fix: {step.fix}", width, indent),
        *command_lines("run:", step.command_line(spool, cli), f"({step.shows})", width, indent),
        wrapped(f"runbook: {step.alert}, {step.runbook()}", width, indent),
    ]


def attention_summary(report: SpoolReport, spool: str, cli: str = CLI, width: int = MAX_WIDTH) -> list[str]:
    """How many engines the spool holds and which have problems; per problem, in the landing page's words, what is
    wrong (every owner: a report names them all) and what to do next."""
    nobody = report.no_engine
    if nobody is not None:
        return [
            wrapped(f"summary: {nobody.concern.value}: {nobody.detail}", width),
            *finding_lines(nobody, spool, cli, width),
            "",
        ]
    if not report.engines:
        return []
    count = plural(len(report.engines), "engine")
    troubled = report.troubled
    if not troubled:
        return [f"summary: {count}, none with a problem", ""]
    lines = [f"summary: {count}, {len(troubled)} with problems:"]
    for engine in troubled:
        facts = dict(engine.facts)
        who = ", ".join(v for v in (facts.get("model"), facts.get("stage"), engine.state.value) if v)
        for finding in engine.findings:
            problems = "; ".join(p.text for p in finding.problems)
            what = printable(f"{engine.engine_id} ({who}): {finding.concern.value}: {problems}")
            lines.append(wrapped(what, width, "  "))
            lines += finding_lines(finding, spool, cli, width)
    return [*lines, ""]


def inspect_report(view: SpoolView, width: int = MAX_WIDTH, spool: str = "DIR", cli: str = CLI) -> str:
    """The spool's report (``presentation.spool_report``, every discovered owner, ended engines judged on what they left:
    a finished run is worth reading): what needs attention first, then every engine in full, the legends of its
    tables, and every rejected file; no line wider than ``width``."""
    if not view.scan.ok:
        return wrapped(f"cannot read the spool: {view.scan.error}", width) + "\n"
    report = spool_report(view, ended_too=True)
    parts = attention_summary(report, spool, cli, width)
    legends: dict[str, None] = {}
    for engine in report.engines:
        parts += [*_engine_lines(engine, width), ""]
        for shown in (engine.declarations, engine.owners, engine.discovered):
            if shown.rows:
                legends[shown.legend] = None
    parts += [line for legend in legends for line in (wrapped(legend, width), "")]
    parts += rejected_lines(report.rejected, report.skipped, width)
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
    if correction.ratio is None:
        return _undeclared_note(engine_id, undeclared_text(correction.owner, "", correction.observed_bytes))
    at = f"max_num_seqs {snapshot.settings.max_num_seqs or 'none'}"
    ratio = float(correction.ratio)
    what = over_declaration(correction.owner, correction.observed_bytes, correction.declared_bytes)
    return (
        f"warning: {engine_id}: {Concern.UNDER_REPORTS.value}: {what} at {at}; its figures are scaled up by {ratio:.2f}"
    )


def _undeclared_note(engine_id: str, what: str) -> str:
    """An undeclared cache in the landing page's words (``what``), then what ``plan`` made of it."""
    return (
        f"warning: {engine_id}: {Concern.UNDECLARED.value}: {printable(what)}; counted as fixed bytes (how they grow "
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
        return wrapped(f"cannot read the spool: {view.scan.error}", width) + "\n"
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
        warnings += [wrapped(_correction_note(engine_id, snapshot, c), width, "") for c in demand.corrections]
        for found in demand.undeclared:
            what = undeclared_text(found.owner, found.owner_class, found.peak_bytes, found.declares)
            warnings.append(wrapped(_undeclared_note(engine_id, what), width, ""))
    parts = []
    if cache_memory is not None:
        parts.append(
            wrapped(f"cache memory: {cache_memory} bytes ({human_bytes(cache_memory)}); fits: {FITS_LEGEND}", width)
        )
    parts.append(table(headers, rows, width, narrow=(0, 1)) if rows else "no engine snapshots in the spool")
    if warnings:
        check = command_lines(
            "what to declare instead:",
            f"{cli} check {spool}",
            "(each owner's verdict and the declaration to write)",
            width,
        )
        parts += [wrapped(FROM_LEGEND, width), *warnings, *check]
    parts += _prescription_lines(view, width)
    states = {item.state for item in view.usable}
    parts += [wrapped(note, width) for state, note in STATE_NOTES.items() if state in states]
    parts += rejected_lines(rejected_files(view.scan), view.scan.skipped, width)
    return "\n".join(parts) + "\n"


def _prescription_lines(view: SpoolView, width: int) -> list[str]:
    """What to give vLLM, per engine: the flag to paste and how it was computed (``sidecar.prescription``)."""
    if not view.usable:
        return []
    lines = [wrapped(f"what to give vLLM at each engine's own max_num_seqs ({PRESCRIPTION_LEGEND}):", width)]
    for item in view.usable:
        lines += prescription_lines(prescription(item.snapshot), f"- {item.snapshot.engine.engine_id}: ", width)
    return lines
