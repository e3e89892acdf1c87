"""The landing page: what it lists, that it escapes what snapshots say, and how Chromium renders it."""

from __future__ import annotations

import re
import struct
import time
from dataclasses import replace
from html import unescape
from pathlib import Path

from modelkv_exporter.contract.snapshot import DiscoveredOwner, DroppedDeclaration
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.contract.thresholds import UNDER_REPORT_TOLERANCE, UNUSED_MIN_CALLS
from modelkv_exporter.sidecar.attention import Concern, findings
from modelkv_exporter.sidecar.http.landing import render_landing
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.reader.state import EngineState, classify
from tests.support.browser import chromium_run
from tests.support.discovered import CENSUS, discovery_status, kv_layout, make_discovered, with_discovery
from tests.support.processes import Sidecar, start_sidecar, stop_process
from tests.support.snapshots import make_declaration, make_observation, make_snapshot

HOSTILE = '<img src=x onerror="alert(1)"><script>alert(2)</script>'


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
    assert (
        "Dropped declarations:</strong> 1 of <code>talker.&lt;b&gt;</code> (declarer_raised: KeyError: &lt;heads&gt;)"
        in html
    )
    assert "2.0 MiB" in html and "process_resident" in html, "growth since the baseline"
    assert "holds 2.00× its declaration" in html and "7 / 7" in html, "observed beside declared per owner"
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
    html = render_landing(classify(SpoolReader(spool).scan(), now, 30.0), spool_dir=str(spool), version="0")
    engines = html.split("<h2>Engines</h2>", 1)[1].split("<h2>Declarations</h2>", 1)[0]
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
    html = render_landing(classify(SpoolReader(spool).scan(), time.time(), 30.0), spool_dir=str(spool), version="0")
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
    items = re.findall(r'<li><a href="#engine-([^"]+)">.*?</ul></li>', section)
    found = re.findall(r'(<li><a href="#engine-[^"]+">.*?</ul></li>)', section)
    return {engine: _text(item) for engine, item in zip(items, found, strict=True)}


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
    assert "under-reports: talker.decoder holds 1.50× its declaration" in summary["tts-eager-s1"]
    assert "stale: no heartbeat for 60" in summary["stuck-s2"]
    for engine in summary:
        assert f'id="engine-{engine}"' in page, "each summary item links to the engine's details"


def test_the_summary_says_when_nothing_needs_attention(spool: Path) -> None:
    write_snapshot(spool, make_snapshot("healthy-s0"))
    html = render_landing(classify(SpoolReader(spool).scan(), time.time(), 30.0), spool_dir=str(spool), version="0")
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
    html = render_landing(classify(SpoolReader(spool).scan(), time.time(), 30.0), spool_dir=str(spool), version="0")
    summary = _summary(html)
    assert "layer.2<b> holds 2.00× its declaration" in summary["many"] and "and 9 more" in summary["many"]
    assert "layer.3" not in summary["many"] and "<b>" not in html.split("</section>", 1)[0].replace("&lt;b&gt;", "")
    assert summary["dropping"] == "dropping m dropped declarations: 2 of talker (declarer_raised)"
    assert "undeclared cache: vocoder holds 64.0 MiB it does not declare" in summary["hiding"]
    assert "declared cache unused: decoder was called 40 times and never used a cache" in summary["idle"]
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
    html = render_landing(classify(SpoolReader(spool).scan(), time.time(), 30.0), spool_dir="s", version="0")
    section = html.split('id="engine-code2wav-s1"', 1)[1].split("<h3", 1)[0]
    headers = re.findall(r"<th>([^<]*)</th>", section)
    first = headers.index("discovered owner")
    assert headers[first : first + 8] == ["discovered owner", "found by", "class", "declares", "recent peak", "peak", "live",
                           "layout seen"]  # fmt: skip
    table = section[section.index("discovered owner") :].split("</table>", 1)[0]
    rows = {re.findall(r"<td[^>]*>(.*?)</td>", r)[0]: r for r in re.findall(r"<tr>(<td.*?)</tr>", table)}
    decoder = re.findall(r"<td[^>]*>(.*?)</td>", rows["tokenizer.decoder"])
    assert decoder[1:4] == [
        "<code>cache_layer</code>",
        "Qwen3TTSTokenizerV2Decoder",
        "<strong>declares nothing</strong>",
    ]
    assert decoder[4] == decoder[5] == "18.0 MiB" and decoder[7] == "8 × 16 × 64 × 72 float32, 4 rows"
    assert "also declares caches" in rows["decoder"] and "no key/value layout" in rows["decoder"]
    assert "the census ran out of its objects budget" in section and "2 owners below the engine's size floor" in section
    assert section.index("observed peak") < section.index("discovered owner") < section.index("<th>cache</th>")
    assert "<script" not in html and "<img" not in html and "encoder.&lt;img src=x" in html
    assert "Discovery is off: turned off by MODELKV_OBSERVE=0." in html


def test_landing_page_shows_the_owners_metrics_exports(spool: Path) -> None:
    """With a budget of 2, the page lists the two largest (18 and 3 MiB, not the 1 MiB one), like /metrics, and
    says how many it left out."""
    _fill_discovered(spool)
    view = classify(SpoolReader(spool).scan(), time.time(), 30.0)
    html = render_landing(view, spool_dir="s", version="0", max_discovered=2)
    assert "tokenizer.decoder" in html and "also declares caches" in html and "StreamingAudioKVCache" not in html
    assert "1 past this exporter's --max-discovered-owners, not exported" in html


def test_a_discovered_owner_renders_in_headless_chromium(spool: Path, tmp_path: Path) -> None:
    _fill_discovered(spool)
    sidecar = start_sidecar(spool)
    try:
        dom = chromium_run(sidecar.url + "/", tmp_path, "--dump-dom", "--virtual-time-budget=2000")
    finally:
        stop_process(sidecar.process)
    assert dom.returncode == 0, dom.stderr[-2000:]
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", dom.stdout, re.S) if "tokenizer.decoder" in r)
    assert "cache_layer" in row and "declares nothing" in row and "8 × 16 × 64 × 72 float32, 4 rows" in row
    assert "<script" not in dom.stdout and "<img" not in dom.stdout, "hostile text stays text after parsing"
