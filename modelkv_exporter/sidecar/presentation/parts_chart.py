"""One engine's memory by part as a picture: one stacked bar of ``sidecar.breakdown``'s parts, as inline SVG,
in the palette's colours.

The bar is as wide as the process figure the parts split; a part takes its share of it, in the
order the parts stack. Beside the bar, the same figures in words (the SVG's text equivalent,
which a terminal browser shows where it draws no SVG). Plain SVG elements, no script; every text
from the snapshot is escaped by the caller's ``escape``.
"""

from __future__ import annotations

from collections.abc import Callable

from modelkv_exporter.contract.sizes import human_bytes
from modelkv_exporter.sidecar.breakdown import headroom_words, part_words, parts_text, whole_and_missing
from modelkv_exporter.sidecar.presentation.palette import PARTS
from modelkv_exporter.sidecar.presentation.spool_report import EngineReport

WIDTH, HEIGHT, TOP = 560, 18, 4


def parts_chart(engine: EngineReport, escape: Callable[[str], str]) -> str:
    """The engine's parts as one bar and its words (which say the parts that are unknown); empty when the engine
    has no sample of a process figure yet."""
    parts = engine.parts
    if parts is None:
        return ""
    positive = {name: value for name, value in parts.parts.items() if value > 0}
    scale = max(parts.total or 0, sum(positive.values())) or 1
    x, rects = 0.0, []
    for name, value in positive.items():
        length = value / scale * WIDTH
        rects.append(
            f'<rect x="{x:.1f}" y="{TOP}" width="{length:.1f}" height="{HEIGHT}" fill="{PARTS[name]}">'
            f"<title>{escape(name)}: {escape(human_bytes(value))}</title></rect>"
        )
        x += length
    title = f"{engine.engine_id}: {parts_text(parts)}"
    whole, missing = whole_and_missing(parts)
    keys = ", ".join(
        f'<span class="key" style="background:{PARTS[name]}"></span>{escape(words)}'
        for name, words in part_words(parts)
    )
    height = HEIGHT + 2 * TOP
    return (
        f'<figure class="parts"><svg class="parts" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
        f'<rect x="0" y="{TOP}" width="{WIDTH}" height="{HEIGHT}" fill="#eef0f3"></rect>{"".join(rects)}</svg>'
        f"<figcaption>Memory by part of {escape(whole)}: {keys or 'none known'}{escape(missing)}"
        f"{escape(headroom_words(parts))}</figcaption></figure>"
    )
