"""The sidecar's landing page: one self-contained HTML page of the spool, for people.

No scripts and no external assets (the app sends a Content-Security-Policy that
forbids both), so it works through ``kubectl port-forward`` and in air-gapped
clusters. It leads with what needs attention: an engine that died (or vanished) first, with its post-mortem
(``post_mortem_section``) before its findings; per engine, each finding of
``sidecar.attention`` (under-reporting owners, undeclared caches, dropped declarations, unused
declared caches, a stale heartbeat) in the words ``inspect``, ``plan`` and the demo use, with its
next step: the change that fixes it, the suggested declaration where the snapshot shows enough to
write one, the command to run and the runbook section; and the engine's picture
(``owner_chart``). Each engine's section draws its memory by part (``parts_chart``) above its owners. Then rejected files and an unreadable spool; the engines table carries each
engine's status; the details follow. Every value from a snapshot is HTML-escaped, and its
unprintable characters (controls, bidi overrides, bytes of file names that are not UTF-8) are shown
as escapes.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from modelkv_exporter.contract.sizes import human_bytes, signed_bytes
from modelkv_exporter.contract.snapshot import Declaration, DiscoveredOwner, Snapshot
from modelkv_exporter.contract.thresholds import NO_ENGINE_SECONDS
from modelkv_exporter.sidecar.attention import (
    CLI,
    NAMED,
    Concern,
    Finding,
    Status,
    findings,
    no_engine,
    status,
    waiting,
)
from modelkv_exporter.sidecar.discovered import discovery_facts, exported_discovery
from modelkv_exporter.sidecar.growth import growth
from modelkv_exporter.sidecar.http.owner_chart import owner_chart
from modelkv_exporter.sidecar.http.parts_chart import parts_chart
from modelkv_exporter.sidecar.http.post_mortem_section import post_mortem_html
from modelkv_exporter.sidecar.http.prescription_section import prescription_section
from modelkv_exporter.sidecar.http.public import SPOOL_UNREADABLE, public_detail, visible
from modelkv_exporter.sidecar.post_mortem import post_mortem
from modelkv_exporter.sidecar.reader.state import EngineState, SpoolView, died
from modelkv_exporter.sidecar.vocabulary import GROWTH_SOURCES, ROOT_OWNER

CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'"
LINKS = (
    ("/metrics", "Prometheus metrics"),
    ("/api/v1/engines", "Snapshots as JSON"),
    ("/healthz", "Liveness"),
    ("/readyz", "Readiness"),
)
GROWTH_LEGEND = (
    "growth since baseline: measured memory now minus the engine's post-initialisation baseline; "
    "growth source: the measurement it is taken from"
)
STATUS_LEGEND = (
    "status: ok, attention (and why), died (ended of out-of-memory or an error, or vanished: killed), stale, ended "
    "or forgotten, judged from each snapshot alone; "
    "unexplained growth above the alert's threshold is a finding here, and pages (ModelKVUndeclaredMemoryGrowth) "
    "once it lasts 15 minutes"
)
PARTS_LEGEND = (
    "growth by part, as the rules judge it (modelkv_engine:undeclared_memory_bytes): live tensors: the floor of "
    "live tensors (between engine steps) above the live tensors after initialisation, or the high-water mark above "
    "that plus the profiled activation peak, whichever is larger (the rule reads the floor's lowest of 10 minutes); "
    "outside torch: the process's device memory less the caching allocator's growth; resident: a CPU engine's "
    "figure; caches explain: what the model-local caches held recently, or declare; unexplained: the rest"
)
GEOMETRY_LEGEND = "geometry: layers × kv_heads × head_dim × positions per row, then the element type"
OBSERVED_LEGEND = (
    "observed peak: the most the owner's transformers caches held at once since the engine started; "
    "recent: within its last sample interval; calls: those that used a cache / all calls into the owner"
)
DISCOVERED_LEGEND = (
    "discovered: modules that hold cache memory they do not declare; found by cache_layer: a transformers cache "
    "built while no declaring owner ran; census: tensors the module holds that it did not hold after "
    "initialisation; layout seen: layers × kv_heads × head_dim × positions a row, the element type, and rows"
)

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:14px 24px}header h1{font-size:18px;margin:0}
header p{margin:4px 0 0;color:#b9c0cc;font-size:13px}main{padding:8px 24px 32px}
nav a{margin-right:16px}a{color:#2457c5}h2{font-size:16px;margin:24px 0 8px}h3{font-size:14px;margin:18px 0 6px}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002;margin-bottom:8px}
th,td{padding:5px 10px;border-bottom:1px solid #e3e6ea;text-align:left;vertical-align:top}
th{background:#eef0f3;font-weight:600}td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
.state{padding:1px 7px;border-radius:9px;font-size:12px}.exported{background:#d7f3df}.stale{background:#fde2c8}.forgotten{background:#e4e4e4}
.ended{background:#e3e6ea}.rejected{background:#f9d0d0}.muted{color:#6b7280}code{font-size:12px}
.ok{background:#d7f3df}.attention{background:#f9d0d0}.died,.vanished{background:#f3b3b3}
.post-mortem th{background:#fbe3e3;white-space:nowrap}
#attention{background:#fff4e5;border-left:4px solid #d9822b;padding:4px 16px 8px;margin:12px 0 14px}
#attention.calm{background:#eef8f1;border-color:#3b9a5b}#attention ul{margin:4px 0;padding-left:20px}
.problem{background:#fff;box-shadow:0 1px 2px #0002;padding:6px 14px 10px;margin:10px 0}.problem h3{margin:6px 0}
.finding{border-top:1px solid #f0e0cc;padding-top:4px;margin-top:6px}.finding p{margin:3px 0}
.what{font-size:15px}.concern{background:#f9d0d0;padding:1px 7px;border-radius:9px;font-size:12px}
pre{background:#f6f7f9;border:1px solid #e3e6ea;padding:6px 10px;margin:4px 0;font-size:12px;overflow-x:auto}
svg.owners{display:block;margin:8px 0 4px;font-size:12px}svg .owner{fill:#1d2330}svg .value{fill:#4b5563}
figure.parts{margin:8px 0 4px}figure.parts figcaption{font-size:12px;color:#4b5563}
.key{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:baseline}
"""


def escape(text: str) -> str:
    """``text`` for HTML: escaped, with unprintable characters shown as visible escapes."""
    return html.escape(visible(text))


def _cells(values: Iterable[str], numeric: Sequence[int] = ()) -> str:
    return "".join(f'<td class="n">{v}</td>' if i in numeric else f"<td>{v}</td>" for i, v in enumerate(values))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(f"<tr>{_cells(row, numeric)}</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


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
    return "—" if value is None else signed_bytes(value, "+")


def growth_row(snapshot: Snapshot, state: EngineState) -> list[str] | None:
    """One engine's growth since baseline by part and the alert it would raise; None before its baseline."""
    judged = growth(snapshot)
    if judged is None or state not in (EngineState.EXPORTED, EngineState.STALE):
        return None
    unexplained = judged.unexplained
    if state is EngineState.STALE:
        alert = "none: a stale engine's figures are not exported"
    elif judged.over_threshold:
        alert = "ModelKVUndeclaredMemoryGrowth, once this lasts 15 minutes"
    else:
        alert = "none"
    return [
        f'<a href="#engine-{escape(snapshot.engine.engine_id)}">{escape(snapshot.engine.engine_id)}</a>',
        _part(judged.live_tensors),
        _part(judged.non_torch),
        _part(judged.resident if judged.resident_measured else None),
        human_bytes(judged.explained),
        "—" if unexplained is None else human_bytes(unexplained),
        escape(alert),
    ]


def _growth_table(live: Sequence[tuple[Snapshot, EngineState]]) -> str:
    rows = [row for s, state in live if (row := growth_row(s, state)) is not None]
    if not rows:
        return ""
    headers = ["engine", "live tensors", "outside torch", "resident", "caches explain", "unexplained", "alert"]
    table = _table(headers, rows, numeric=(1, 2, 3, 4, 5))
    return f'<h3 id="growth">Growth since baseline</h3>{table}<p class="muted">{escape(PARTS_LEGEND)}</p>'


def _status_cell(state: EngineState, found: Sequence[Finding]) -> str:
    word = status(state, found).value
    concerns = ", ".join(f.concern.value for f in found if f.concern is not Concern.STALE)
    return f'<span class="state {word}">{word}</span>' + (f": {escape(concerns)}" if concerns else "")


def _engine_row(snapshot: Snapshot, state: EngineState, now: float) -> list[str]:
    engine = snapshot.engine
    growth = measured_growth(snapshot)
    return [
        f'<a href="#engine-{escape(engine.engine_id)}">{escape(engine.engine_id)}</a>',
        _status_cell(state, findings(snapshot, state, now)),
        escape(engine.model_label),
        escape(engine.stage_label),
        f'<span class="state {state.value}">{state.value}</span>',
        "—" if snapshot.settings.max_num_seqs is None else str(snapshot.settings.max_num_seqs),
        str(len(snapshot.declarations)),
        human_bytes(snapshot.declared_peak_bytes),
        "—" if growth is None else signed_bytes(growth[1]),
        "" if growth is None else f"<code>{escape(growth[0])}</code>",
        f"{max(now - snapshot.heartbeat_at, 0):.0f} s",
    ]


def generated_at(now: float) -> str:
    """``now`` as the page shows it: UTC, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))


def _geometry(d: Declaration) -> str:
    return escape(f"{d.layers} × {d.kv_heads} × {d.head_dim} × {d.physical_capacity_positions} {d.dtype}")


def _declaration_row(d: Declaration) -> list[str]:
    notes = [n for n in (d.rows_reason, d.allocation_note) if n]
    return [
        escape(d.owner or ROOT_OWNER),
        escape(d.name),
        escape(d.scope),
        escape(f"{d.rows} = {d.row_count}"),
        human_bytes(d.bytes_per_row),
        human_bytes(d.peak_bytes),
        _geometry(d),
        f"<code>{escape(d.capacity_source)}</code>",
        escape("; ".join(notes)),
    ]


def _owner_rows(snapshot: Snapshot) -> list[list[str]]:
    """Per owner: what it declares beside what its caches were observed to hold, or why they were not."""
    rows = []
    for owner, observation in snapshot.owners().items():
        declared = snapshot.declared_peak_of(owner)
        name = escape(owner or ROOT_OWNER)
        if observation is None or not observation.available:
            why = "the engine does not report it" if observation is None else observation.reason or ""
            rows.append([name, human_bytes(declared), "—", "—", "—", f'<span class="muted">{escape(why)}</span>'])
            continue
        peak = observation.peak_bytes or 0
        verdict = f"holds {peak / declared:.2f}× its declaration" if declared and peak > declared else ""
        if not declared and peak:
            verdict = "holds caches it does not declare"
        calls = f"{observation.cache_calls} / {observation.calls}"
        recent = observation.recent_peak_bytes or 0
        rows.append([name, human_bytes(declared), human_bytes(peak), human_bytes(recent), calls, escape(verdict)])
    return rows


def _layout_seen(found: DiscoveredOwner) -> str:
    layout = found.layout
    if layout is None:
        return '<span class="muted">no key/value layout</span>'
    rows = f"{layout.rows} row" + ("" if layout.rows == 1 else "s")
    shape = f"{layout.layers} × {layout.kv_heads} × {layout.head_dim} × {layout.positions} {layout.dtype}, {rows}"
    return escape(shape)


def _discovered_row(found: DiscoveredOwner) -> list[str]:
    return [
        escape(found.owner or ROOT_OWNER),
        f"<code>{escape(found.found_by)}</code>",
        escape(found.owner_class),
        "also declares caches" if found.declares else "<strong>declares nothing</strong>",
        human_bytes(found.recent_peak_bytes),
        human_bytes(found.peak_bytes),
        human_bytes(found.live_bytes),
        _layout_seen(found),
    ]


def _discovery_facts(snapshot: Snapshot, omitted: int) -> str:
    """One line on what discovery covered and left out (empty when the writer does not report it)."""
    status = snapshot.discovery
    facts = []
    if status is not None:
        if not status.enabled:
            return f'<p class="muted">Discovery is off: {escape(status.reason or "no reason given")}.</p>'
        facts += [f"<strong>{f.text}</strong>" if f.urgent else f.text for f in discovery_facts(status, escape)]
    if omitted:
        facts.append(f"{omitted} past this exporter's --sidecar-max-discovered-owners, not exported")
    return f'<p class="muted">{" · ".join(facts)}</p>' if facts else ""


def _discovered(snapshot: Snapshot, limit: int) -> str:
    """The owners the engine discovered (those /metrics exports), beside its declared ones; empty without any."""
    exported = exported_discovery(snapshot, limit)
    facts = _discovery_facts(snapshot, exported.omitted)
    if not exported.owners:
        return facts
    headers = ["discovered owner", "found by", "class", "declares", "recent peak", "peak", "live", "layout seen"]
    rows = [_discovered_row(found) for found in exported.owners]
    legend = f'<p class="muted">{escape(DISCOVERED_LEGEND)}</p>'
    return f"{_table(headers, rows, numeric=(4, 5, 6))}{facts}{legend}"


def _engine_section(snapshot: Snapshot, max_discovered: int) -> str:
    engine = snapshot.engine
    title = f'<h3 id="engine-{escape(engine.engine_id)}">{escape(engine.engine_id)}</h3>'
    facts = [
        ("architecture", engine.architecture),
        ("ranks", engine.ranks_label),
        ("device", engine.device),
        ("writer", snapshot.writer),
        ("sleep", snapshot.sleep.summary if snapshot.sleep is not None else None),
    ]
    line = " · ".join(f"{k} <code>{escape(str(v))}</code>" for k, v in facts if v)
    owners = _owner_rows(snapshot)
    observed = ""
    if owners:
        headers = ["owner", "declared peak", "observed peak", "recent peak", "calls", ""]
        observed = f'{_table(headers, owners, numeric=(1, 2, 3, 4))}<p class="muted">{escape(OBSERVED_LEGEND)}</p>'
    dropped = [
        f"{d.count} of <code>{escape(d.owner or ROOT_OWNER)}</code> ({escape(d.reason)}: {escape(d.error)})"
        for d in snapshot.dropped_declarations or ()
    ]
    if dropped:
        line += "</p><p><strong>Dropped declarations:</strong> " + "; ".join(dropped)
    observed = (
        parts_chart(snapshot, escape)
        + prescription_section(snapshot, escape)
        + owner_chart(snapshot, escape, max_discovered)
        + observed
        + _discovered(snapshot, max_discovered)
    )
    if not snapshot.declarations:
        return f'{title}<p class="muted">{line}</p>{observed}<p>No model-local KV caches declared.</p>'
    headers = ["owner", "cache", "scope", "rows", "per row", "declared peak", "geometry", "capacity", "notes"]
    rows = [_declaration_row(d) for d in snapshot.declarations]
    return f'{title}<p class="muted">{line}</p>{observed}{_table(headers, rows, numeric=(4, 5))}'


@dataclass(frozen=True)
class Guidance:
    """How the page writes a finding's next step: the command as the reader runs it, and the runbook's address.

    ``spool`` "" leaves the directory out of the command: the page shows no paths, and in the sidecar's
    container the command reads ``MODELKV_SPOOL_DIR``."""

    spool: str = ""
    cli: str = CLI
    runbook_url: str = ""


def _runbook(finding: Finding, guidance: Guidance) -> str:
    step = finding.step
    if guidance.runbook_url:
        return f'<a href="{escape(step.runbook(guidance.runbook_url))}">{escape(step.alert)}</a>'
    return f"{escape(step.alert)} in <code>{escape(step.runbook())}</code>"


def _suggestions(finding: Finding) -> str:
    shown = [p for p in finding.problems[:NAMED] if p.suggestion]
    return "".join(
        f"<p><strong>Suggested declaration</strong> for {escape(p.owner or ROOT_OWNER)}"
        f"{f' ({escape(p.owner_class)})' if p.owner_class else ''}:</p><pre>{_lines(p.suggestion or '')}</pre>"
        for p in shown
    )


def _lines(text: str) -> str:
    """Several lines of plain text for a ``<pre>``: each escaped, the line breaks kept."""
    return "\n".join(escape(line) for line in text.splitlines())


def _prose(text: str) -> str:
    """A next step's text: escaped, with its `commands` set as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def _finding_html(finding: Finding, guidance: Guidance) -> str:
    """One finding: what is wrong, then the fix, the suggested declaration, the command and the runbook section."""
    step = finding.step
    command = step.command_line(guidance.spool, guidance.cli)
    where = "" if guidance.spool else f"from a laptop: {step.in_pod()}; "
    return (
        f'<div class="finding"><p class="what"><span class="concern">{escape(finding.concern.value)}</span> '
        f"{escape(finding.detail)}</p>"
        f"<p><strong>Fix:</strong> {_prose(step.fix)}</p>{_suggestions(finding)}"
        f"<p><strong>Run:</strong> <code>{escape(command)}</code> <span class=muted>({escape(where + step.shows)})</span></p>"
        f"<p><strong>Runbook:</strong> {_runbook(finding, guidance)}</p></div>"
    )


def _no_engine(view: SpoolView, guidance: Guidance, up_for: float | None) -> str | None:
    """The section the page opens with while no engine publishes into the spool (None while one does): waiting, for
    an exporter younger than ``NO_ENGINE_SECONDS``; else the finding and what to check."""
    finding = no_engine(view, up_for)
    if finding is None:
        return None
    if waiting(up_for):
        return (
            '<section id="attention" class="calm"><h2>Needs attention</h2>'
            f"<p>Waiting for an engine: {escape(finding.detail)}. {escape(finding.step.alert)} fires if none has "
            f"published {NO_ENGINE_SECONDS // 60} min after the exporter started.</p></section>"
        )
    return (
        '<section id="attention"><h2>Needs attention: no engine</h2>'
        f'<article class="problem" id="attention-no-engine">{_finding_html(finding, guidance)}</article></section>'
    )


def _attention(
    view: SpoolView,
    live: Sequence[tuple[Snapshot, EngineState]],
    guidance: Guidance,
    max_discovered: int,
    up_for: float | None = None,
) -> str:
    """The section the page opens with: each engine that needs attention, what is wrong and what to do, with its
    picture; then rejected files and the spool; or that no engine publishes at all."""
    nobody = _no_engine(view, guidance, up_for)
    if nobody is not None:
        return nobody
    engines: list[str] = []
    items: list[str] = []
    if view.scan.error:
        items.append(f"<li><strong>spool not readable</strong>: {escape(SPOOL_UNREADABLE)}</li>")
    ok = 0
    died: list[str] = []
    for snapshot, state in live:
        found = findings(snapshot, state, view.now)
        if not found:
            ok += status(state, found) is Status.OK
            continue
        engine = snapshot.engine
        who = " · ".join(v for v in (engine.model_label, engine.stage_label) if v)
        dead = post_mortem(snapshot, state)
        (engines if dead is None else died).append(
            f'<article class="problem" id="attention-{escape(engine.engine_id)}">'
            f'<h3><a href="#engine-{escape(engine.engine_id)}">{escape(engine.engine_id)}</a> '
            f'<span class="muted">{escape(who)}</span></h3>'
            f"{'' if dead is None else post_mortem_html(dead, escape)}"
            f"{''.join(_finding_html(f, guidance) for f in found)}{owner_chart(snapshot, escape, max_discovered)}"
            "</article>"
        )
    engines = died + engines
    if view.rejected:
        names = [f"{entry.file_name} ({entry.error.reason.value})" for entry in view.rejected if entry.error]
        more = f"; and {len(names) - NAMED} more" if len(names) > NAMED else ""
        items.append(
            f'<li><a href="#rejected">{len(names)} rejected snapshot file{"s" if len(names) != 1 else ""}</a>: '
            f"{escape('; '.join(names[:NAMED]) + more)}</li>"
        )
    if view.scan.skipped:
        items.append(f"<li>{view.scan.skipped} files past --max-spool-files or --max-spool-bytes not read</li>")
    if not engines and not items:
        return (
            '<section id="attention" class="calm"><h2>Needs attention</h2>'
            f"<p>Nothing: {ok} engine{'s' if ok != 1 else ''} ok.</p></section>"
        )
    count = f": {len(engines)} engine{'s' if len(engines) != 1 else ''}" if engines else ""
    others = f"<ul>{''.join(items)}</ul>" if items else ""
    return f'<section id="attention"><h2>Needs attention{count}</h2>{"".join(engines)}{others}</section>'


def render_landing(
    view: SpoolView,
    *,
    spool_dir: str,
    version: str,
    max_discovered: int,
    cli: str = CLI,
    cli_spool: str = "",
    runbook_url: str = "",
    up_for: float | None = None,
) -> str:
    """The whole page for one view of the spool; per engine at most ``max_discovered`` discovered owners, as
    /metrics exports them. Next steps name ``cli`` with ``cli_spool`` (see ``Guidance``) and link the runbook at
    ``runbook_url`` (else name its place in a checkout). ``up_for``: seconds the exporter has run (None: unknown),
    which tells an engine still loading from one that does not publish."""
    rejected: list[list[str]] = []
    for entry in view.rejected:
        assert entry.error is not None
        reason = f'<span class="state rejected">{escape(entry.error.reason.value)}</span>'
        rejected.append([escape(entry.file_name), reason, escape(public_detail(entry.error))])
    live = [(item.snapshot, item.state) for item in view.usable]
    summary = ", ".join(f"{n} {state.value}" for state, n in view.counts.items())
    if view.scan.skipped:
        summary += f" ({view.scan.skipped} files past --max-spool-files or --max-spool-bytes not read)"
    if view.scan.error:
        summary = f"<strong>spool not readable: {escape(SPOOL_UNREADABLE)}</strong>"
    nav = "".join(f'<a href="{href}">{escape(text)}</a>' for href, text in LINKS)
    headers = ["engine", "status", "model", "stage", "state", "max_num_seqs", "caches", "declared peak",
               "growth since baseline", "growth source", "age"]  # fmt: skip
    engines = _table(headers, [_engine_row(s, state, view.now) for s, state in live], numeric=(5, 6, 7, 8, 10))
    if live:
        engines += f'<p class="muted">{escape(STATUS_LEGEND)}<br>{escape(GROWTH_LEGEND)}</p>'
        engines += _growth_table(live)
    else:
        engines = '<p class="muted">No snapshot in the spool yet.</p>'
    sections = "".join(
        _engine_section(s, max_discovered)
        for s, state in live
        if state is not EngineState.FORGOTTEN and (state is not EngineState.ENDED or died(s))
    )
    rejected_html = _table(["file", "reason", "detail"], rejected) if rejected else '<p class="muted">None.</p>'
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>modelkv-exporter</title><style>{_STYLE}</style></head><body>"
        f"<header><h1>modelkv-exporter {escape(version)}</h1>"
        f"<p>spool <code>{escape(spool_dir)}</code> · {summary} · generated {generated_at(view.now)}</p></header>"
        f"<main>{_attention(view, live, Guidance(cli_spool, cli, runbook_url), max_discovered, up_for)}<nav>{nav}</nav><h2>Engines</h2>{engines}"
        f"<h2>Declarations</h2>"
        f"{f'<p class=muted>{escape(GEOMETRY_LEGEND)}</p>{sections}' if sections else '<p class=muted>None.</p>'}"
        f'<h2 id="rejected">Rejected files</h2>{rejected_html}</main></body></html>\n'
    )
