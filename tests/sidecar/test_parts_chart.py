"""The landing page's bar of each engine's memory by part, and its words for readers without SVG.

Served by a real sidecar over the golden spool of the memory breakdown and read back by headless
Chromium; the words are also read as a text browser reads the page (every SVG left out).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.breakdown import breakdown
from modelkv_exporter.sidecar.presentation.page import escape
from modelkv_exporter.sidecar.presentation.palette import PARTS
from modelkv_exporter.sidecar.presentation.parts_chart import WIDTH, parts_chart
from modelkv_exporter.sidecar.presentation.spool_report import engine_report
from modelkv_exporter.sidecar.reader.decode import parse_snapshot
from modelkv_exporter.sidecar.reader.state import EngineState
from modelkv_testbed import ROOT
from modelkv_testbed.browser import chromium_run
from modelkv_testbed.processes import start_sidecar, stop_process
from modelkv_testbed.snapshots import make_snapshot

GOLDEN = ROOT / "tests" / "sidecar" / "golden" / "memory-breakdown"
HOSTILE = '<img src=x onerror="alert(1)">'


def chart(snapshot: Snapshot, quote: Callable[[str], str] = escape) -> str:
    """The parts chart of ``snapshot``'s report."""
    return parts_chart(engine_report(snapshot, EngineState.EXPORTED, 0.0), quote)


class _TextBrowser(HTMLParser):
    """The text a browser without SVG shows: every text node outside ``<svg>``, ``<style>`` and ``<title>``."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = 0
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.hidden += tag in ("svg", "style", "title")

    def handle_endtag(self, tag: str) -> None:
        self.hidden -= tag in ("svg", "style", "title")

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.text.append(data)


def text_without_svg(page: str) -> str:
    reader = _TextBrowser()
    reader.feed(page)
    return " ".join(" ".join(reader.text).split())


def _widths(svg: str) -> dict[str, float]:
    return {
        name: float(width)
        for width, name in re.findall(r'<rect x="[\d.]+" y="\d+" width="([\d.]+)"[^>]*><title>(\w+):', svg)
    }


def test_a_complete_breakdown_is_one_full_bar_in_the_order_the_parts_stack() -> None:
    snapshot = parse_snapshot((GOLDEN / "qwen3-vllm034-dp0.json").read_bytes())
    parts = breakdown(snapshot)
    assert parts is not None and parts.complete and parts.total is not None
    svg = chart(snapshot, escape)
    widths = _widths(svg)
    assert list(widths) == [name for name, value in parts.parts.items() if value > 0]
    assert abs(sum(widths.values()) - WIDTH) < 0.5, "complete parts fill the process's bar"
    for name, width in widths.items():
        assert abs(width - parts.parts[name] / parts.total * WIDTH) < 0.1, name
        assert f'fill="{PARTS[name]}"><title>{name}:' in svg


def test_the_words_say_every_part_and_what_is_unknown() -> None:
    complete = chart(parse_snapshot((GOLDEN / "qwen3-vllm034-dp0.json").read_bytes()), escape)
    words = text_without_svg(complete)
    assert words.startswith(
        "Memory by part of process_gpu 76.5 GiB: runtime 1.0 GiB (1%), weights 15.0 GiB (20%), paged_kv 57.0 GiB (75%)"
    )
    assert "unexplained 56.0 MiB (0%)" in words and "unknown" not in words
    assert words.endswith("; vLLM keeps 2.5 GiB of the device free for torch"), "the headroom, beside the parts"
    older = text_without_svg(chart(parse_snapshot((GOLDEN / "before-breakdown-dp0.json").read_bytes()), escape))
    assert older == (
        "Memory by part of process_gpu 20.0 GiB: none known; unknown: runtime, weights, cuda_graphs, "
        "activation_peak, model_local_caches, unexplained"
    )
    host = text_without_svg(chart(parse_snapshot((GOLDEN / "qwen3-cpu-dp0.json").read_bytes()), escape))
    assert host.startswith("Memory by part of process_resident 9.0 GiB: runtime 1.5 GiB (17%), weights 3.0 GiB (33%)")
    assert "cuda_graphs" not in host and "headroom" not in host


def test_no_sample_no_bar_and_a_hostile_engine_id_stays_text() -> None:
    assert chart(make_snapshot("quiet"), escape) == ""
    svg = chart(make_snapshot(HOSTILE, measured={"process_resident": 1 << 30}), escape)
    assert HOSTILE not in svg and escape(HOSTILE) in svg


def test_the_served_page_draws_each_engine_s_bar_and_its_words(spool: Path, tmp_path: Path) -> None:
    for document in GOLDEN.glob("*.json"):
        shutil.copyfile(document, spool / document.name)
    write_snapshot(spool, make_snapshot("fresh-cpu", measured={"process_resident": 1 << 30}))
    sidecar = start_sidecar(spool)
    try:
        page = sidecar.get("/").text
        dom = chromium_run(sidecar.url + "/", tmp_path, "--dump-dom", "--virtual-time-budget=2000")
    finally:
        stop_process(sidecar.process)
    assert dom.returncode == 0, dom.stderr[-2000:]
    figures = re.findall(r'<figure class="parts">(.*?)</figure>', dom.stdout, re.S)
    assert len(figures) == 4, "one bar per engine in its section"
    assert all("<svg" in figure and "<figcaption>" in figure for figure in figures)
    words = text_without_svg(page)
    assert words.count("Memory by part of") == 4
    assert (
        "Memory by part of process_resident 1.0 GiB: none known; unknown: runtime, weights, model_local_caches, "
        "unexplained" in unescape(words)
    )
