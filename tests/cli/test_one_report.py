"""The landing page and ``inspect`` draw one report: every fact, cell, legend and discovery fact of each engine's
report (``sidecar.presentation.spool_report``) is in both, in the same words.

The spool is the golden one of every kind the contract writes (declared, observed, discovered, memory by part, an
older writer), so each table and legend has rows. A renderer that words a figure its own way (``8x16`` where the
report says ``8 × 16``) fails, as the broken run shows.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from html import unescape
from pathlib import Path

import pytest

from modelkv_exporter.cli import reports
from modelkv_exporter.cli.reports import inspect_report
from modelkv_exporter.sidecar.presentation.page import render_page
from modelkv_exporter.sidecar.presentation.safe_text import printable
from modelkv_exporter.sidecar.presentation.spool_report import SpoolReport, spool_report
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.reader.state import SpoolView, classify
from modelkv_testbed import ROOT

GOLDEN = ROOT / "tests" / "sidecar" / "golden"
KINDS = ("discovered", "observed", "memory-breakdown")
WIDE = 100_000
"""A terminal wide enough that no cell is cut and no line wrapped."""


@pytest.fixture
def view(tmp_path: Path) -> SpoolView:
    for kind in KINDS:
        for document in (GOLDEN / kind).glob("*.json"):
            shutil.copyfile(document, tmp_path / document.name)
    return classify(SpoolReader(tmp_path).scan(), time.time(), 1e9, 1e9)


def said(report: SpoolReport) -> Iterator[str]:
    """Everything the report says of its engines that both renderers must show."""
    for engine in report.engines:
        yield engine.engine_id
        for name, value in engine.facts:
            yield name
            yield value
        for table in (engine.declarations, engine.owners, engine.discovered):
            if table.rows:
                yield table.legend
                yield from (column.name for column in table.columns if column.name)
            yield from (cell for row in table.rows for cell in row if cell)
        yield from (fact.text for fact in engine.discovery)
        yield from engine.growth or ()


def missing(view: SpoolView, page: str, text: str) -> list[str]:
    """What the report says that the page or ``inspect`` does not (whitespace aside: a terminal pads columns)."""
    page_words, text_words = " ".join(unescape(page).split()), " ".join(text.split())
    wanted = (" ".join(printable(words).split()) for words in said(spool_report(view, ended_too=True)))
    return [words for words in wanted if words not in page_words or words not in text_words]


def rendered(view: SpoolView) -> tuple[str, str]:
    return render_page(view, spool_dir="s", version="0", max_discovered=WIDE), inspect_report(view, WIDE)


def test_the_page_and_inspect_say_every_word_of_the_report(view: SpoolView) -> None:
    report = spool_report(view, ended_too=True)
    assert len(report.engines) >= 6 and all(e.detailed for e in report.engines), "every engine has its section"
    for table in ("declarations", "owners", "discovered"):
        assert any(getattr(e, table).rows for e in report.engines), table
    assert any(e.parts for e in report.engines) and any(e.discovery for e in report.engines)
    assert len(list(said(report))) > 300
    assert missing(view, *rendered(view)) == []


def test_broken_a_renderer_that_words_the_geometry_itself_is_caught(
    view: SpoolView, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_words: Callable[[str], str] = lambda text: printable(text).replace(" × ", "x")  # noqa: E731
    monkeypatch.setattr(reports, "printable", own_words)
    page, text = rendered(view)
    assert "8x16x64x71" in text
    assert "8 × 16 × 64 × 71 float32" in missing(view, page, text)
