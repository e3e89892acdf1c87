"""One engine's owners as a picture: declared, observed and discovered bytes per owner, as inline SVG.

Bars of one engine share one scale, so an owner holding more than it declares shows a longer
observed bar than declared one, and a module that declares nothing shows a discovered bar alone. Colours are the
palette's: purple for caches as declared and held within a declaration, red for memory nothing declares.
Plain SVG elements in the page (no script, no external reference: the page's Content-Security-Policy
allows neither); every text from the snapshot is escaped by the caller's ``escape``.
"""

from __future__ import annotations

from collections.abc import Callable

from modelkv_exporter.contract.sizes import human_bytes
from modelkv_exporter.sidecar.attention import owner_name
from modelkv_exporter.sidecar.presentation.palette import CACHES, CACHES_HELD, NOT_DECLARED
from modelkv_exporter.sidecar.presentation.spool_report import Bar, EngineReport
from modelkv_exporter.sidecar.presentation.wording import ABSENT

LABEL_WIDTH, BAR_WIDTH, VALUE_WIDTH = 220, 300, 260
BAR, GAP, OWNER_GAP, TOP = 11, 2, 10, 26
MAX_LABEL = 30
"""Characters of an owner's path shown beside its bars; a longer path keeps its tail."""
KEYS = (("declared", CACHES), ("held within it", CACHES_HELD), ("not declared", NOT_DECLARED))
"""The picture's legend: what each colour means."""


def colour(bar: Bar) -> str:
    """The palette's colour of a bar: a declaration, what was held within it, or memory nothing declares."""
    if bar.not_declared:
        return NOT_DECLARED
    return CACHES if bar.kind == "declared" else CACHES_HELD


def _label(owner: str) -> str:
    name = owner_name(owner)
    return name if len(name) <= MAX_LABEL else "…" + name[len(name) - MAX_LABEL + 1 :]


def owner_chart(engine: EngineReport, escape: Callable[[str], str]) -> str:
    """The engine's owners (``EngineReport.bars``) as an ``<svg>`` element; empty when it has no owner to draw."""
    rows = engine.bars
    if not rows:
        return ""
    scale = max((bar.value or 0 for _, bars in rows for bar in bars), default=0) or 1
    width = LABEL_WIDTH + BAR_WIDTH + VALUE_WIDTH
    parts, y = [], TOP
    for owner, bars in rows:
        height = len(bars) * (BAR + GAP) - GAP
        parts.append(
            f'<text x="0" y="{y + height / 2 + 4:.0f}" class="owner">{escape(_label(owner))}<title>{escape(owner_name(owner))}</title></text>'
        )
        for bar in bars:
            length = 0 if not bar.value else max(1.0, bar.value / scale * BAR_WIDTH)
            figure = ABSENT if bar.value is None else human_bytes(bar.value)
            words = " ".join(w for w in (bar.kind, figure, bar.note) if w)
            parts.append(
                f'<rect x="{LABEL_WIDTH}" y="{y}" width="{length:.1f}" height="{BAR}" fill="{colour(bar)}">'
                f"<title>{escape(owner_name(owner))}: {escape(words)}</title></rect>"
                f'<text x="{LABEL_WIDTH + length + 6:.1f}" y="{y + BAR - 1}" class="value">{escape(words)}</text>'
            )
            y += BAR + GAP
        y += OWNER_GAP
    legend = "".join(
        f'<rect x="{x}" y="4" width="12" height="12" fill="{colour}"></rect><text x="{x + 16}" y="14" class="value">{name}</text>'
        for x, (name, colour) in zip(
            (LABEL_WIDTH, LABEL_WIDTH + 90, LABEL_WIDTH + 220),
            KEYS,
            strict=True,
        )
    )
    title = f"{engine.engine_id}: declared, observed and discovered bytes per owner"
    return (
        f'<svg class="owners" width="{width}" height="{y}" '
        f'viewBox="0 0 {width} {y}" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
        f"{legend}{''.join(parts)}</svg>"
    )
