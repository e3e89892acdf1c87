"""One engine's owners as a picture: declared, observed and discovered bytes per owner, as inline SVG.

Bars of one engine share one scale, so an owner holding more than it declares shows a longer
observed bar than declared one, and a module that declares nothing shows a discovered bar alone.
Plain SVG elements in the page (no script, no external reference: the page's Content-Security-Policy
allows neither); every text from the snapshot is escaped by the caller's ``escape``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from modelkv_exporter.contract.sizes import human_bytes
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.thresholds import UNDER_REPORT_TOLERANCE
from modelkv_exporter.sidecar.attention import owner_name
from modelkv_exporter.sidecar.discovered import exported_discovery

DECLARED, OBSERVED, OVER, DISCOVERED = "#4a78c2", "#3b9a5b", "#d64545", "#9b59b6"
"""Bar colours: declared, observed within the declaration, observed above it, discovered (not declared)."""
LABEL_WIDTH, BAR_WIDTH, VALUE_WIDTH = 220, 300, 260
BAR, GAP, OWNER_GAP, TOP = 11, 2, 10, 26
MAX_LABEL = 30
"""Characters of an owner's path shown beside its bars; a longer path keeps its tail."""


@dataclass(frozen=True)
class Bar:
    """One bar: which figure, its bytes (None: not measured, said in words), and its colour."""

    kind: str
    value: int | None
    colour: str
    note: str = ""


def owner_bars(snapshot: Snapshot, max_discovered: int) -> list[tuple[str, list[Bar]]]:
    """Per owner (declaring owners, then discovered ones not among them), the bars of its picture."""
    rows: dict[str, list[Bar]] = {}
    for owner, observation in snapshot.owners().items():
        declared = snapshot.declared_peak_of(owner)
        bars = [Bar("declared", declared, DECLARED)]
        if observation is None or not observation.available:
            bars.append(Bar("observed", None, OBSERVED, "not observed"))
        else:
            peak = observation.peak_bytes or 0
            over = peak > UNDER_REPORT_TOLERANCE * declared
            bars.append(
                Bar(
                    "observed", peak, OVER if over else OBSERVED, f"{peak / declared:.2f}×" if over and declared else ""
                )
            )
        rows[owner] = bars
    for found in exported_discovery(snapshot, max_discovered).owners:
        note = "beyond its declared caches" if found.declares else "not declared"
        rows.setdefault(found.owner, []).append(Bar("discovered", found.peak_bytes, DISCOVERED, note))
    return list(rows.items())


def _label(owner: str) -> str:
    name = owner_name(owner)
    return name if len(name) <= MAX_LABEL else "…" + name[len(name) - MAX_LABEL + 1 :]


def owner_chart(snapshot: Snapshot, escape: Callable[[str], str], max_discovered: int) -> str:
    """The engine's picture as an ``<svg>`` element; empty when it has no owner to draw."""
    rows = owner_bars(snapshot, max_discovered)
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
            figure = "—" if bar.value is None else human_bytes(bar.value)
            words = " ".join(w for w in (bar.kind, figure, bar.note) if w)
            parts.append(
                f'<rect x="{LABEL_WIDTH}" y="{y}" width="{length:.1f}" height="{BAR}" fill="{bar.colour}">'
                f"<title>{escape(owner_name(owner))}: {escape(words)}</title></rect>"
                f'<text x="{LABEL_WIDTH + length + 6:.1f}" y="{y + BAR - 1}" class="value">{escape(words)}</text>'
            )
            y += BAR + GAP
        y += OWNER_GAP
    legend = "".join(
        f'<rect x="{x}" y="4" width="12" height="12" fill="{colour}"></rect><text x="{x + 16}" y="14" class="value">{name}</text>'
        for x, (name, colour) in zip(
            (LABEL_WIDTH, LABEL_WIDTH + 90, LABEL_WIDTH + 240, LABEL_WIDTH + 330),
            (("declared", DECLARED), ("observed (within)", OBSERVED), ("above it", OVER), ("discovered", DISCOVERED)),
            strict=True,
        )
    )
    title = f"{snapshot.engine.engine_id}: declared, observed and discovered bytes per owner"
    return (
        f'<svg class="owners" width="{width}" height="{y}" '
        f'viewBox="0 0 {width} {y}" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
        f"{legend}{''.join(parts)}</svg>"
    )
