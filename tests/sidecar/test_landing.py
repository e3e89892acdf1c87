"""The landing page: what it lists, that it escapes what snapshots say, and how Chromium renders it."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import time
from dataclasses import replace
from html import unescape
from pathlib import Path

import pytest
import yaml

from modelkv_exporter.contract.snapshot import DiscoveredOwner, DroppedDeclaration
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.contract.thresholds import UNDER_REPORT_TOLERANCE, UNUSED_MIN_CALLS
from modelkv_exporter.demo.engines import UNDECLARED, UNDER_DECLARING
from modelkv_exporter.sidecar.attention import NEXT_STEPS, Concern, findings
from modelkv_exporter.sidecar.budget import Budget
from modelkv_exporter.sidecar.presentation.owner_chart import owner_chart
from modelkv_exporter.sidecar.presentation.page import escape, render_page
from modelkv_exporter.sidecar.presentation.palette import NOT_DECLARED
from modelkv_exporter.sidecar.presentation.spool_report import engine_report
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.reader.state import EngineState, classify
from modelkv_testbed import ROOT
from modelkv_testbed.browser import chromium_run
from modelkv_testbed.processes import Sidecar, start_sidecar, stop_process
from modelkv_testbed.promql import RULES_FILE
from modelkv_testbed.snapshots import make_declaration, make_observation, make_snapshot
from tests.support.demo_engines import running_demo_engines
from tests.support.discovered import CENSUS, discovery_status, kv_layout, make_discovered, with_discovery

HOSTILE = '<img src=x onerror="alert(1)"><script>alert(2)</script>'

LIMIT = Budget().sidecar_max_discovered_owners
"""The sidecar's default discovered-owner budget."""


def _fill(spool: Path) -> None:
    write_snapshot(
        spool,
        make_snapshot(
            "talker-s0",
            declarations=(make_declaration("kv", owner="talker.decoder"), make_declaration("pool", rows="fixed")),
            measured={"process_resident": 3 << 20},
            baseline={"process_resident": 1 << 20},
            stage_name="talker",
            observations=(
                make_observation("talker.decoder", peak_bytes=2 * make_declaration("kv").peak_bytes, calls=7),
                make_observation("", reason=HOSTILE, calls=3),
            ),
        ),
    )
    dropped = (DroppedDeclaration("talker.<b>", "T", "declarer_raised", 1, "KeyError: <heads>"),)
    write_snapshot(spool, replace(make_snapshot("plain-s1", declarations=()), dropped_declarations=dropped))
    write_snapshot(spool, make_snapshot("gone-s2", interval=1.0, heartbeat_at=time.time() - 600))
    write_snapshot(spool, make_snapshot("evil", declarations=(make_declaration(HOSTILE, capacity_source=HOSTILE),)))
    (spool / "broken.json").write_text("{")


def test_landing_page_lists_engines_declarations_and_rejected_files(sidecar: Sidecar) -> None:
    _fill(sidecar.spool_dir)
    page = sidecar.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    html = page.text
    for text in (
        "talker-s0",
        "plain-s1",
        "gone-s2",
        "talker.decoder",
        "No model-local KV caches declared",
        "broken.json",
    ):
        assert text in html, text
    assert "3 exported" in html and "1 stale" in html and "1 rejected" in html and "0 forgotten" in html
    assert "Dropped declarations:</strong> 1 of talker.&lt;b&gt; (T), declarer_raised: KeyError: &lt;heads&gt;" in html
    assert "2.0 MiB" in html and "process_resident" in html, "growth since the baseline"
    assert "holds 2.00× its declaration" in html and "7/7" in html, "observed beside declared per owner"
    assert "&lt;img src=x" in html and "the engine does not report it" in html, "absent with its reason"
    for link in ("/metrics", "/api/v1/engines", "/healthz", "/readyz"):
        assert f'href="{link}"' in html
    assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html
    assert "http://" not in html and "https://" not in html and "src=" not in html.replace("src=x", "")


def test_landing_page_says_when_the_spool_is_unreadable(sidecar: Sidecar) -> None:
    sidecar.spool_dir.rmdir()
    page = sidecar.get("/")
    assert page.status_code == 200 and "spool not readable" in page.text


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_landing_page_renders_in_headless_chromium(sidecar: Sidecar, tmp_path: Path) -> None:
    _fill(sidecar.spool_dir)
    dom = chromium_run(sidecar.url + "/", tmp_path, "--dump-dom", "--virtual-time-budget=2000")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<h1>modelkv-exporter" in dom.stdout and "talker-s0" in dom.stdout
    assert dom.stdout.count("<tr>") >= 1 + 4 + 1 + 2 + 1 + 1 + 1, "engine, declaration and rejected rows"
    assert "<script" not in dom.stdout and "<img" not in dom.stdout, "hostile text stays text after parsing"

    shot = tmp_path / "landing.png"
    result = chromium_run(sidecar.url + "/", tmp_path, f"--screenshot={shot}", "--window-size=1280,900")
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    data = shot.read_bytes()
    assert _png_size(data) == (1280, 900)
    assert len(data) > 20_000, "a blank page compresses to a few KiB"


def test_landing_page_labels_growth_explains_geometry_and_says_when_it_was_made(spool: Path) -> None:
    now = 1_790_000_000.0  # 2026-09-21 14:13:20 UTC
    write_snapshot(
        spool,
        make_snapshot(
            "talker-s0",
            declarations=(make_declaration("kv", layers=16, kv_heads=8, head_dim=128, positions=4096),),
            measured={"process_resident": 3 << 20},
            baseline={"process_resident": 1 << 20},
            heartbeat_at=now,
        ),
    )
    html = render_page(
        classify(SpoolReader(spool).scan(), now, 30.0, 0.0), spool_dir=str(spool), version="0", max_discovered=LIMIT
    )
    engines = html.split("<h2>Engines</h2>", 1)[1].split("</table>", 1)[0]
    headers = re.findall(r"<th>([^<]*)</th>", engines)
    assert "growth since baseline" in headers and "growth source" in headers and "growth" not in headers
    (row,) = [r for r in re.findall(r"<tr>(.*?)</tr>", engines) if "talker-s0" in r]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    growth = headers.index("growth since baseline")
    assert cells[growth] == "2.0 MiB" and cells[headers.index("growth source")] == "<code>process_resident</code>"
    assert "post-initialisation baseline" in html
    assert "16 × 8 × 128 × 4096 float32" in html
    assert "geometry: layers × kv_heads × head_dim × positions per row" in html
    assert "generated 2026-09-21 14:13:20 UTC" in html


def test_an_engine_without_max_num_seqs_shows_none_of_it(spool: Path) -> None:
    write_snapshot(spool, make_snapshot("diffusion-s2", max_num_seqs=None))
    html = render_page(
        classify(SpoolReader(spool).scan(), time.time(), 30.0, 0.0),
        spool_dir=str(spool),
        version="0",
        max_discovered=LIMIT,
    )
    row = html[html.index("diffusion-s2</a>") :].split("</tr>")[0]
    assert '<td class="n">—</td>' in row and "None" not in row


def _text(fragment: str) -> str:
    """The text of an HTML fragment, as a reader sees it: tags dropped, entities decoded, spaces collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", fragment)).split()).replace(" :", ":")


def _status_column(page: str) -> dict[str, str]:
    """Engine id -> the text of its status cell, from the engines table."""
    engines = page.split(">Engines</h2>", 1)[1].split("</table>", 1)[0]
    headers = [_text(h) for h in re.findall(r"<th>(.*?)</th>", engines)]
    rows = [
        [_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)] for row in re.findall(r"<tr>(.*?)</tr>", engines)
    ]
    return {row[0]: row[headers.index("status")] for row in rows if row}


def _summary(page: str) -> dict[str, str]:
    """Engine id -> the text of its item in the "Needs attention" summary."""
    section = page.split('<section id="attention"', 1)[1].split("</section>", 1)[0]
    found = re.findall(r'<article class="problem" id="attention-([^"]+)">(.*?)</article>', section, re.S)
    return {engine: _text(re.sub(r"<svg.*?</svg>", "", item, flags=re.S)) for engine, item in found}


def test_an_operator_sees_first_which_engines_need_attention_and_why(sidecar: Sidecar, tmp_path: Path) -> None:
    """One engine whose owner holds 1.5x its declaration, one whose heartbeat stopped, one healthy.

    The operator opening ``/`` expects, before any table of figures, a summary naming the two
    engines that need attention with the reason of each, linked to their details; the healthy
    engine is not in it. The engines table says the same in its status column: ``ok``,
    ``attention: under-reports``, ``stale``. Read from the DOM headless Chromium builds.
    """
    declared = make_declaration("kv", owner="talker.decoder")
    within = make_observation("talker.decoder", peak_bytes=int(declared.peak_bytes * 1.04))
    over = make_observation("talker.decoder", peak_bytes=declared.peak_bytes * 3 // 2)
    write_snapshot(sidecar.spool_dir, make_snapshot("healthy-s0", declarations=(declared,), observations=(within,)))
    write_snapshot(sidecar.spool_dir, make_snapshot("tts-eager-s1", declarations=(declared,), observations=(over,)))
    write_snapshot(sidecar.spool_dir, make_snapshot("stuck-s2", interval=1.0, heartbeat_at=time.time() - 600))

    dom = chromium_run(sidecar.url + "/", tmp_path, "--dump-dom", "--virtual-time-budget=2000")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    assert page.index("Needs attention") < page.index(">Engines</h2>") < page.index(">Declarations</h2>")

    assert _status_column(page) == {"healthy-s0": "ok", "tts-eager-s1": "attention: under-reports", "stuck-s2": "stale"}
    summary = _summary(page)
    assert set(summary) == {"tts-eager-s1", "stuck-s2"}, "the healthy engine is not listed"
    assert "under-reports talker.decoder holds 1.50× its declaration" in summary["tts-eager-s1"]
    assert "stale no heartbeat for 60" in summary["stuck-s2"]
    for engine in summary:
        assert f'id="engine-{engine}"' in page, "each summary item links to the engine's details"


def test_the_summary_says_when_nothing_needs_attention(spool: Path) -> None:
    write_snapshot(spool, make_snapshot("healthy-s0"))
    html = render_page(
        classify(SpoolReader(spool).scan(), time.time(), 30.0, 0.0),
        spool_dir=str(spool),
        version="0",
        max_discovered=LIMIT,
    )
    assert "Needs attention</h2><p>Nothing: 1 engine ok.</p>" in html
    assert _status_column(html) == {"healthy-s0": "ok"}


def test_every_concern_reaches_the_summary_bounded_and_escaped(spool: Path) -> None:
    """Dropped declarations, an undeclared cache, a declared cache never used, rejected files.

    Twelve under-reporting owners name three and count the rest, so the summary stays short
    whatever a snapshot holds; names from snapshots stay text.
    """
    owners = [f"layer.{i}<b>" for i in range(12)]
    declarations = tuple(make_declaration("kv", owner=o) for o in owners)
    peak = declarations[0].peak_bytes * 2
    write_snapshot(
        spool,
        make_snapshot(
            "many", declarations=declarations, observations=tuple(make_observation(o, peak_bytes=peak) for o in owners)
        ),
    )
    dropped = (DroppedDeclaration("talker", "T", "declarer_raised", 2, "KeyError"),)
    write_snapshot(spool, replace(make_snapshot("dropping", declarations=()), dropped_declarations=dropped))
    found = DiscoveredOwner("vocoder", "V", "census", 64 << 20, 64 << 20, 64 << 20)
    write_snapshot(spool, replace(make_snapshot("hiding"), discovered=(found,)))
    idle = make_observation("decoder", calls=40, cache_calls=0)
    write_snapshot(spool, make_snapshot("idle", observations=(idle,)))
    for i in range(5):
        (spool / f"junk{i}.json").write_text("{")
    html = render_page(
        classify(SpoolReader(spool).scan(), time.time(), 30.0, 0.0),
        spool_dir=str(spool),
        version="0",
        max_discovered=LIMIT,
    )
    summary = _summary(html)
    assert "layer.2<b> holds 2.00× its declaration" in summary["many"] and "and 9 more" in summary["many"]
    assert "layer.3" not in summary["many"] and "<b>" not in html.split("</section>", 1)[0].replace("&lt;b&gt;", "")
    assert "dropped declarations 2 of talker (declarer_raised: KeyError)" in summary["dropping"]
    assert "undeclared cache vocoder (V) holds 64.0 MiB it does not declare" in summary["hiding"]
    assert "declared cache unused decoder was called 40 times and never used a cache" in summary["idle"]
    section = html.split('<section id="attention"', 1)[1].split("</section>", 1)[0]
    assert '<a href="#rejected">5 rejected snapshot files</a>' in section and "; and 2 more" in section
    assert 'id="rejected"' in html
    assert _status_column(html)["hiding"] == "attention: undeclared cache"


def test_the_page_judges_by_the_shared_thresholds() -> None:
    """An owner past the shared tolerance is a finding and one at it is not; an owner called the shared number of
    times without using its cache is one, a call fewer is not. The rules are tested against the same numbers
    (tests/deploy/test_rules.py), so the page and the alerts agree."""
    declared = make_declaration("kv", owner="talker.decoder")
    at = int(declared.peak_bytes * UNDER_REPORT_TOLERANCE)

    def found(peak: int, calls: int = 0) -> list[Concern]:
        observation = make_observation("talker.decoder", peak_bytes=peak, calls=calls, cache_calls=0)
        snapshot = make_snapshot("judged-s0", declarations=(declared,), observations=(observation,))
        return [f.concern for f in findings(snapshot, EngineState.EXPORTED, time.time())]

    assert found(at) == [] and found(at + 1) == [Concern.UNDER_REPORTS]
    assert found(0, UNUSED_MIN_CALLS - 1) == [] and found(0, UNUSED_MIN_CALLS) == [Concern.UNUSED]


def _fill_discovered(spool: Path) -> None:
    """One engine that declares a cache and whose other modules hold caches they do not declare (one of them at a
    hostile path), and one with discovery off."""
    found = (
        make_discovered("tokenizer.decoder", layout=kv_layout(layers=8, kv_heads=16, head_dim=64, positions=72)),
        make_discovered(f"encoder.{HOSTILE}", found_by=CENSUS, owner_class="StreamingAudioKVCache"),
        make_discovered("decoder", found_by=CENSUS, declares=True, peak_bytes=3 << 20),
    )
    status = discovery_status(below_floor=2, budget_exhausted="objects")
    write_snapshot(spool, with_discovery(make_snapshot("code2wav-s1", stage_name="code2wav"), found, status))
    off = discovery_status(enabled=False, reason="turned off by MODELKV_OBSERVE=0")
    write_snapshot(spool, with_discovery(make_snapshot("thinker-s0", declarations=()), (), off))


def test_landing_page_lists_discovered_owners_beside_declared_ones(spool: Path) -> None:
    _fill_discovered(spool)
    html = render_page(
        classify(SpoolReader(spool).scan(), time.time(), 30.0, 0.0), spool_dir="s", version="0", max_discovered=LIMIT
    )
    section = html.split('id="engine-code2wav-s1"', 1)[1].split("<h3", 1)[0]
    headers = re.findall(r"<th>([^<]*)</th>", section)
    first = headers.index("discovered owner")
    assert headers[first : first + 8] == ["discovered owner", "found by", "declares", "peak", "recent peak", "live",
                           "layout seen", "class"]  # fmt: skip
    table = section[section.index("discovered owner") :].split("</table>", 1)[0]
    rows = {re.findall(r"<td[^>]*>(.*?)</td>", r)[0]: r for r in re.findall(r"<tr>(<td.*?)</tr>", table)}
    decoder = re.findall(r"<td[^>]*>(.*?)</td>", rows["tokenizer.decoder"])
    assert decoder[1:3] == ["cache_layer", "nothing"] and decoder[7] == "Qwen3TTSTokenizerV2Decoder"
    assert decoder[3] == decoder[4] == "18.0 MiB" and decoder[6] == "8 × 16 × 64 × 72 float32, 4 rows"
    assert "<td>also</td>" in rows["decoder"] and "no key/value layout seen" in rows["decoder"]
    words = unescape(section)
    assert "the census ran out of its objects budget" in words and "2 owners below the engine's size floor" in words
    assert section.index("observed peak") < section.index("discovered owner") < section.index("<th>cache</th>")
    assert "<script" not in html and "<img" not in html and "encoder.&lt;img src=x" in html
    assert "discovery is off: turned off by MODELKV_OBSERVE=0" in html


def test_landing_page_shows_the_owners_metrics_exports(spool: Path) -> None:
    """With a budget of 2, the tables and pictures list the two largest (18 and 3 MiB, not the 1 MiB one), like
    /metrics, and say how many they left out. (The summary names every owner the engine found: a finding is not
    an export.)"""
    _fill_discovered(spool)
    view = classify(SpoolReader(spool).scan(), time.time(), 30.0, 0.0)
    html = render_page(view, spool_dir="s", version="0", max_discovered=2)
    summary, details = html.split("<h2>Engines</h2>", 1)
    assert "StreamingAudioKVCache" in summary
    assert "tokenizer.decoder" in details and "<td>also</td>" in details
    assert "StreamingAudioKVCache" not in details
    charts = "".join(re.findall(r"<svg.*?</svg>", html, re.S))
    assert "tokenizer.decoder" in charts and "encoder.&lt;img" not in charts, "pictures draw the exported owners"
    assert "1 past this exporter's --sidecar-max-discovered-owners, not exported" in unescape(html)


def test_a_discovered_owner_renders_in_headless_chromium(spool: Path, tmp_path: Path) -> None:
    _fill_discovered(spool)
    sidecar = start_sidecar(spool)
    try:
        dom = chromium_run(sidecar.url + "/", tmp_path, "--dump-dom", "--virtual-time-budget=2000")
    finally:
        stop_process(sidecar.process)
    assert dom.returncode == 0, dom.stderr[-2000:]
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", dom.stdout, re.S) if "tokenizer.decoder" in r)
    assert "cache_layer" in row and "nothing" in row and "8 × 16 × 64 × 72 float32, 4 rows" in row
    assert "<script" not in dom.stdout and "<img" not in dom.stdout, "hostile text stays text after parsing"


def _problem(page: str, engine: str) -> str:
    """The text of one engine's item in "Needs attention", its picture left out."""
    return _summary(page)[engine]


def test_a_newcomer_reads_what_is_wrong_with_each_demo_engine_and_what_fixes_it(tmp_path: Path) -> None:
    """The demo's two problem engines, run as the demo runs them, served by the real sidecar, read by Chromium.

    Without any docs, the page's opening section must say for each: what is wrong, in figures; the
    change that fixes it (for the under-reporting owner, the declaration sized to what it held, as
    code); the command that prints it; the runbook section; and a picture of declared, observed and
    discovered bytes per owner whose bars have the figures' proportions.
    """
    spool = tmp_path / "spool"
    spool.mkdir()
    with running_demo_engines(spool, (UNDER_DECLARING, UNDECLARED)):
        sidecar = start_sidecar(spool)
        try:
            dom = chromium_run(sidecar.url + "/", tmp_path, "--dump-dom", "--virtual-time-budget=2000")
            shot = tmp_path / "landing.png"
            picture = chromium_run(sidecar.url + "/", tmp_path, f"--screenshot={shot}", "--window-size=1280,1000")
        finally:
            stop_process(sidecar.process)
    assert dom.returncode == 0 and picture.returncode == 0, dom.stderr[-2000:] + picture.stderr[-2000:]
    page = dom.stdout
    assert page.index("Needs attention: 2 engines") < page.index(">Engines</h2>")
    assert set(_summary(page)) == {UNDER_DECLARING, UNDECLARED}

    eager = _problem(page, UNDER_DECLARING)
    assert re.search(r"under-reports tokenizer\.decoder holds 1\.50× its declaration \(53\.2 MiB observed, 35\.5 MiB "
                     r"declared\)", eager), eager  # fmt: skip
    assert "Fix: declare what the owner's caches hold: change its model_local_kv_specs()" in eager
    assert "Suggested declaration for tokenizer.decoder (EagerCodecDecoder): ModelLocalKVSpec(" in eager
    for figure in ("layers=8,", "kv_heads=16,", "head_dim=64,", "dtype=torch.float32,", "rows=RowDriver.MAX_NUM_SEQS"):
        assert figure in eager, f"the declared geometry, sized to what was held: {figure}"
    assert (
        "Run: modelkv-exporter check (from a laptop: kubectl exec <pod> -n <namespace> -c modelkv-exporter -- "
        "modelkv-exporter check; each owner's verdict and the declaration to write" in eager
    ), eager
    assert str(spool) not in page, "the page shows no paths"
    assert "Runbook: ModelKVDeclarationUnderReports in docs/runbook.md#modelkvdeclarationunderreports" in eager

    streaming = _problem(page, UNDECLARED)
    assert "undeclared cache apm.streaming_kv (StreamingAudioKVCache) holds 70.3 MiB it does not declare" in streaming
    assert "Fix: declare the cache: add model_local_kv_specs() to the module's class" in streaming
    assert "Run: modelkv-exporter check (from a laptop: kubectl exec <pod>" in streaming
    assert "Runbook: ModelKVUndeclaredCache in docs/runbook.md#modelkvundeclaredcache" in streaming

    section = page.split('<section id="attention"', 1)[1].split("</section>", 1)[0]
    charts = dict(re.findall(r'id="attention-([^"]+)">.*?(<svg.*?</svg>)', section, re.S))
    eager_bars = _bars(charts[UNDER_DECLARING])
    assert set(eager_bars) == {"declared", "observed"}
    assert eager_bars["observed"] == pytest.approx(1.5 * eager_bars["declared"], rel=0.01)
    assert list(_bars(charts[UNDECLARED])) == ["discovered"], "a cache nobody declares: a discovered bar alone"
    assert "<script" not in page
    assert len(shot.read_bytes()) > 20_000


def _bars(svg: str) -> dict[str, float]:
    """Bar kind -> width, from the bars' titles (``owner: kind figure``)."""
    return {
        kind: float(width) for width, kind in re.findall(r'<rect [^>]*width="([\d.]+)"[^>]*><title>[^:<]*: (\w+)', svg)
    }


def test_the_picture_draws_each_owner_to_one_scale() -> None:
    """Declared beside observed, and discovered, on one scale per engine; an unobserved owner is said, not drawn
    as 0. Scaling the observed peak moves its bar and nothing else: the bars are the figures."""
    declared = make_declaration("kv", owner="talker")
    for factor in (1.0, 2.0):
        observed = make_observation("talker", peak_bytes=int(declared.peak_bytes * factor))
        blind = make_observation("vocoder", reason="replayed a CUDA graph")
        found = make_discovered("codec", found_by=CENSUS, peak_bytes=declared.peak_bytes // 2, owner_class="C")
        snapshot = replace(
            make_snapshot("e", declarations=(declared,), observations=(observed, blind)), discovered=(found,)
        )
        svg = owner_chart(engine_report(snapshot, EngineState.EXPORTED, 0.0, max_discovered=LIMIT), escape)
        rects = re.findall(r'<rect [^>]*width="([\d.]+)"[^>]*><title>([^<]*)</title>', svg)
        by_title = {title: float(width) for width, title in rects}
        talker_declared = by_title["talker: declared 35.5 MiB"]
        talker_observed = next(w for t, w in by_title.items() if t.startswith("talker: observed"))
        codec = by_title["codec: discovered 17.8 MiB not declared"]
        assert talker_observed == pytest.approx(factor * talker_declared, rel=0.01)
        assert codec == pytest.approx(talker_declared / 2, rel=0.01)
        assert "vocoder: observed — not observed" in by_title and by_title["vocoder: observed — not observed"] == 0
        red = re.findall(rf'fill="{NOT_DECLARED}"><title>([^<]*)', svg)
        over = (
            [next(t for t in by_title if t.startswith("talker: observed"))] if factor > UNDER_REPORT_TOLERANCE else []
        )
        assert red == [*over, "codec: discovered 17.8 MiB not declared"], "what no declaration accounts for, in red"
    assert (
        owner_chart(engine_report(make_snapshot("nothing", declarations=()), EngineState.EXPORTED, 0.0), escape) == ""
    )


def test_every_next_step_names_an_alert_with_a_runbook_section() -> None:
    """The page's runbook links land: each concern's alert is in the rule file and is a section of the runbook."""
    alerts = {
        rule.get("alert") for group in yaml.safe_load(RULES_FILE.read_text())["groups"] for rule in group["rules"]
    }
    sections = set(re.findall(r"^## (\S+)$", (ROOT / "docs" / "runbook.md").read_text(), re.M))
    assert set(NEXT_STEPS) == set(Concern)
    for step in NEXT_STEPS.values():
        assert step.alert in alerts and step.alert in sections, step.alert


def test_a_runbook_address_links_each_problem_to_its_section(spool: Path) -> None:
    """Given --runbook-url (the chart's runbookUrl), the page links the section; a relative or fragment address is
    refused naming the flag and the variable."""
    write_snapshot(spool, replace(make_snapshot("hiding"), discovered=(make_discovered("vocoder"),)))
    view = classify(SpoolReader(spool).scan(), time.time(), 30.0, 0.0)
    url = "https://wiki.example.com/modelkv/runbook.md"
    html = render_page(view, spool_dir="s", version="0", runbook_url=url, max_discovered=LIMIT)
    assert f'<a href="{url}#modelkvundeclaredcache">ModelKVUndeclaredCache</a>' in html
    assert "docs/runbook.md#modelkvundeclaredcache" in render_page(
        view, spool_dir="s", version="0", max_discovered=LIMIT
    )
    for flag, environ in ((["--runbook-url", "docs/runbook.md"], {}), ([], {"MODELKV_RUNBOOK_URL": url + "#top"})):
        result = subprocess.run(
            [sys.executable, "-m", "modelkv_exporter", "serve", "--spool-dir", str(spool), *flag],
            capture_output=True, text=True, timeout=60, env={**os.environ, **environ},
        )  # fmt: skip
        assert result.returncode == 2 and "is not an absolute http(s) address without a #fragment" in result.stderr
        assert ("--runbook-url" if flag else "MODELKV_RUNBOOK_URL") in result.stderr.splitlines()[-1]


def test_a_sleeping_engine_says_so_on_the_page_and_in_inspect(spool: Path) -> None:
    """vLLM's sleep level, in the same words on the page and in ``inspect``; an awake engine says nothing of sleep."""
    from modelkv_exporter.cli.reports import inspect_report
    from modelkv_exporter.contract.snapshot import SleepState

    now = time.time()
    asleep = replace(make_snapshot("trainer-side", heartbeat_at=now), sleep=SleepState(1, {"weights": 1 << 30}))
    awake = replace(make_snapshot("serving", heartbeat_at=now), sleep=SleepState(0, {}))
    write_snapshot(spool, asleep)
    write_snapshot(spool, awake)
    view = classify(SpoolReader(spool).scan(), now, 30.0, 0.0)
    html = render_page(view, spool_dir=str(spool), version="0", max_discovered=LIMIT)
    words = "asleep, level 1: weights offloaded to host memory"
    section = html.split('id="engine-trainer-side"', 1)[1].split("<h3", 1)[0]
    assert f"sleep <code>{words}</code>" in section
    assert "asleep" not in html.split('id="engine-serving"', 1)[1].split("<h3", 1)[0]
    report = inspect_report(view, 200)
    assert words in report and report.count("asleep") == 1
