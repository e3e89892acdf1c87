"""The sidecar's landing page: ``presentation.spool_report``'s spool report as one self-contained HTML page, for people.

No scripts and no external assets (the app sends a Content-Security-Policy that forbids both), so it works through
``kubectl port-forward`` and in air-gapped clusters. It leads with what needs attention: an engine that died (or
vanished) first, with its post-mortem before its findings; per engine, each finding with its next step (the change
that fixes it, the suggested declaration where the snapshot shows enough to write one, the command to run and the
runbook section) and the engine's owners as a picture (``owner_chart``); then rejected files and an unreadable
spool. The engines table carries each engine's status, and each engine's section draws its memory by part
(``parts_chart``) above its owners. The words are the report's; every value is HTML-escaped, and unprintable
characters (controls, bidi overrides, bytes of file names that are not UTF-8) are shown as escapes.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

from modelkv_exporter.contract.sizes import human_bytes, signed_bytes
from modelkv_exporter.contract.thresholds import NO_ENGINE_SECONDS
from modelkv_exporter.sidecar.attention import CLI, NAMED, Concern, Finding, owner_name, waiting
from modelkv_exporter.sidecar.post_mortem import utc_time
from modelkv_exporter.sidecar.prescription import PRESCRIPTION_LEGEND, estimate_text, prescription_text
from modelkv_exporter.sidecar.presentation.owner_chart import owner_chart
from modelkv_exporter.sidecar.presentation.parts_chart import parts_chart
from modelkv_exporter.sidecar.presentation.safe_text import SPOOL_UNREADABLE, client_detail, printable
from modelkv_exporter.sidecar.presentation.spool_report import EngineReport, SpoolReport, Table, spool_report
from modelkv_exporter.sidecar.presentation.wording import (
    ABSENT,
    GROWTH_COLUMNS,
    GROWTH_LEGEND,
    PARTS_LEGEND,
    SKIPPED,
    STATUS_LEGEND,
    plural,
)
from modelkv_exporter.sidecar.reader.state import SpoolView

CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'"
LINKS = (
    ("/metrics", "Prometheus metrics"),
    ("/api/v1/engines", "Snapshots as JSON"),
    ("/healthz", "Liveness"),
    ("/readyz", "Readiness"),
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
    return html.escape(printable(text))


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A table of cells already in HTML; ``numeric`` columns aligned right."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="n">{v}</td>' if i in numeric else f"<td>{v}</td>" for i, v in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _table(table: Table) -> str:
    """A report's table with its legend under it; empty without rows."""
    if not table.rows:
        return ""
    numeric = [i for i, c in enumerate(table.columns) if c.kind == "figure"]
    rows = [[escape(cell) for cell in row] for row in table.rows]
    legend = f'<p class="muted">{escape(table.legend)}</p>' if table.legend else ""
    return _html_table([c.name for c in table.columns], rows, numeric) + legend


def _engine_link(engine_id: str) -> str:
    return f'<a href="#engine-{escape(engine_id)}">{escape(engine_id)}</a>'


def _growth_table(engines: Sequence[EngineReport]) -> str:
    rows = [[_engine_link(e.engine_id), *map(escape, e.growth)] for e in engines if e.growth is not None]
    if not rows:
        return ""
    table = _html_table(["engine", *GROWTH_COLUMNS], rows, numeric=(1, 2, 3, 4, 5))
    return f'<h3 id="growth">Growth since baseline</h3>{table}<p class="muted">{escape(PARTS_LEGEND)}</p>'


def _status_cell(engine: EngineReport) -> str:
    word = engine.status.value
    concerns = ", ".join(f.concern.value for f in engine.findings if f.concern is not Concern.STALE)
    return f'<span class="state {word}">{word}</span>' + (f": {escape(concerns)}" if concerns else "")


def _engine_row(engine: EngineReport) -> list[str]:
    facts = dict(engine.facts)
    growth = engine.measured_growth
    return [
        _engine_link(engine.engine_id),
        _status_cell(engine),
        escape(facts.get("model", "")),
        escape(facts.get("stage", "")),
        f'<span class="state {engine.state.value}">{engine.state.value}</span>',
        escape(facts["max_num_seqs"]),
        str(len(engine.declarations.rows)),
        human_bytes(engine.declared_peak),
        ABSENT if growth is None else signed_bytes(growth[1]),
        "" if growth is None else f"<code>{escape(growth[0])}</code>",
        f"{engine.age:.0f} s",
    ]


def _discovery(engine: EngineReport) -> str:
    facts = [f"<strong>{escape(f.text)}</strong>" if f.urgent else escape(f.text) for f in engine.discovery]
    return f'<p class="muted">{" · ".join(facts)}</p>' if facts else ""


def _prescription(engine: EngineReport) -> str:
    """What to give vLLM: the flag to paste, how it was computed, and where vLLM's estimate was off; or why not."""
    found = engine.prescription
    flag = f" <code>{escape(found.flag)}</code>" if found.flag is not None else ""
    estimate = estimate_text(found)
    off = f'<p class="muted">vLLM\'s start-up estimate: {escape(estimate)}</p>' if estimate else ""
    return (
        f'<p class="prescription"><strong>What to give vLLM:</strong>{flag} {escape(prescription_text(found))}</p>'
        f'{off}<p class="muted">{escape(PRESCRIPTION_LEGEND)}</p>'
    )


def _post_mortem(engine: EngineReport) -> str:
    if not engine.post_mortem:
        return ""
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in engine.post_mortem)
    return f'<div class="post-mortem"><p class="what"><strong>Post-mortem</strong></p><table>{rows}</table></div>'


def _engine_section(engine: EngineReport) -> str:
    title = f'<h3 id="engine-{escape(engine.engine_id)}">{escape(engine.engine_id)}</h3>'
    facts = " · ".join(f"{escape(name)} <code>{escape(value)}</code>" for name, value in engine.facts)
    dropped = (
        f"<p><strong>Dropped declarations:</strong> {escape('; '.join(engine.dropped))}</p>" if engine.dropped else ""
    )
    declarations = _table(engine.declarations) or "<p>No model-local KV caches declared.</p>"
    return (
        f'{title}<p class="muted">{facts}</p>{dropped}{parts_chart(engine, escape)}{_prescription(engine)}'
        f"{owner_chart(engine, escape)}{_table(engine.owners)}{_table(engine.discovered)}{_discovery(engine)}"
        f"{declarations}"
    )


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
        f"<p><strong>Suggested declaration</strong> for {escape(owner_name(p.owner or ''))}"
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


def _no_engine(report: SpoolReport, guidance: Guidance, up_for: float | None) -> str | None:
    """The section the page opens with while no engine publishes into the spool (None while one does): waiting, for
    an exporter younger than ``NO_ENGINE_SECONDS``; else the finding and what to check."""
    finding = report.no_engine
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


def _trouble(engine: EngineReport, guidance: Guidance) -> str:
    """One engine that needs attention: its post-mortem, each finding with its next step, and its picture."""
    return (
        f'<article class="problem" id="attention-{escape(engine.engine_id)}">'
        f'<h3>{_engine_link(engine.engine_id)} <span class="muted">{escape(engine.who)}</span></h3>'
        f"{_post_mortem(engine)}{''.join(_finding_html(f, guidance) for f in engine.findings)}"
        f"{owner_chart(engine, escape)}</article>"
    )


def _attention(report: SpoolReport, guidance: Guidance, up_for: float | None) -> str:
    """The section the page opens with: each engine that needs attention, what is wrong and what to do, with its
    picture; then rejected files and the spool; or that no engine publishes at all."""
    nobody = _no_engine(report, guidance, up_for)
    if nobody is not None:
        return nobody
    items: list[str] = []
    if report.unreadable:
        items.append(f"<li><strong>spool not readable</strong>: {escape(SPOOL_UNREADABLE)}</li>")
    troubled = report.troubled
    if report.rejected:
        names = [f"{name} ({error.reason.value})" for name, error in report.rejected]
        more = f"; and {len(names) - NAMED} more" if len(names) > NAMED else ""
        items.append(
            f'<li><a href="#rejected">{plural(len(names), "rejected snapshot file")}</a>: '
            f"{escape('; '.join(names[:NAMED]) + more)}</li>"
        )
    if report.skipped:
        items.append(f"<li>{report.skipped} {SKIPPED}</li>")
    if not troubled and not items:
        return (
            '<section id="attention" class="calm"><h2>Needs attention</h2>'
            f"<p>Nothing: {plural(report.ok, 'engine')} ok.</p></section>"
        )
    count = f": {plural(len(troubled), 'engine')}" if troubled else ""
    others = f"<ul>{''.join(items)}</ul>" if items else ""
    engines = "".join(_trouble(e, guidance) for e in troubled)
    return f'<section id="attention"><h2>Needs attention{count}</h2>{engines}{others}</section>'


def render_page(
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
    report = spool_report(view, max_discovered=max_discovered, up_for=up_for)
    summary = ", ".join(f"{n} {state.value}" for state, n in view.counts.items())
    if report.skipped:
        summary += f" ({report.skipped} {SKIPPED})"
    if report.unreadable:
        summary = f"<strong>spool not readable: {escape(SPOOL_UNREADABLE)}</strong>"
    nav = "".join(f'<a href="{href}">{escape(text)}</a>' for href, text in LINKS)
    headers = ["engine", "status", "model", "stage", "state", "max_num_seqs", "caches", "declared peak",
               "growth since baseline", "growth source", "age"]  # fmt: skip
    engines = report.engines
    if engines:
        table = _html_table(headers, [_engine_row(e) for e in engines], numeric=(5, 6, 7, 8, 10))
        table += f'<p class="muted">{escape(STATUS_LEGEND)}<br>{escape(GROWTH_LEGEND)}</p>{_growth_table(engines)}'
    else:
        table = '<p class="muted">No snapshot in the spool yet.</p>'
    sections = "".join(_engine_section(e) for e in engines if e.detailed)
    rejected = [
        [escape(name), f'<span class="state rejected">{escape(why.reason.value)}</span>', escape(client_detail(why))]
        for name, why in report.rejected
    ]
    rejected_html = _html_table(["file", "reason", "detail"], rejected) if rejected else '<p class="muted">None.</p>'
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>modelkv-exporter</title><style>{_STYLE}</style></head><body>"
        f"<header><h1>modelkv-exporter {escape(version)}</h1>"
        f"<p>spool <code>{escape(spool_dir)}</code> · {summary} · generated {utc_time(view.now)}</p></header>"
        f"<main>{_attention(report, Guidance(cli_spool, cli, runbook_url), up_for)}<nav>{nav}</nav>"
        f"<h2>Engines</h2>{table}<h2>Declarations</h2>{sections or '<p class=muted>None.</p>'}"
        f'<h2 id="rejected">Rejected files</h2>{rejected_html}</main></body></html>\n'
    )
