"""Draw a dashboard as self-contained HTML, for a picture in the docs.

Grafana itself is not needed: boxes sit where ``gridPos`` puts them (24 columns,
30 px a grid row, as Grafana draws them), each with its title and type. Given the
data its queries returned (``PanelData``), a time series panel draws its series as
SVG lines (dashed where the panel's overrides say so) with a legend, and a table
panel its first rows; without data, each box lists its queries.
``scripts/docs_images.py`` fills the data from a real Prometheus and screenshots the page.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

COLUMN_PX = 56
ROW_PX = 30
GAP_PX = 6
COLOURS = ("#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a", "#37872d", "#c4162a")

_STYLE = """
body{margin:0;background:#111217;font:12px/1.35 system-ui,sans-serif;color:#ccccdc}
h1{font-size:16px;margin:0;padding:12px 12px 4px;color:#fff}p.vars{margin:0;padding:0 12px 10px;color:#8e8ea0}
.grid{position:relative;margin:0 12px}.panel{position:absolute;box-sizing:border-box;background:#181b1f;
border:1px solid #2c3235;border-radius:3px;padding:6px 8px;overflow:hidden}
.panel b{color:#fff;font-size:13px}.panel i{color:#6e9fff;font-style:normal;margin-left:6px}
.panel code{display:block;color:#8e8ea0;font-size:11px;margin-top:3px;white-space:nowrap;overflow:hidden;
text-overflow:ellipsis}.row{background:none;border:none;border-bottom:1px solid #2c3235;padding:4px 0}
.row b{font-size:14px}svg{display:block;margin-top:4px}.legend{font-size:11px;white-space:nowrap;overflow:hidden}
.legend span{display:inline-block;width:10px;height:3px;margin-right:4px;vertical-align:middle}
.legend em{font-style:normal;color:#8e8ea0;margin-left:6px}table{border-collapse:collapse;margin-top:4px;font-size:11px}
td,th{padding:2px 8px;border-bottom:1px solid #2c3235;text-align:left;white-space:nowrap}th{color:#8e8ea0}
"""


@dataclass
class Line:
    """One series of a time series panel: its legend, query refId and points."""

    legend: str
    ref_id: str
    points: list[tuple[float, float]]


@dataclass
class PanelData:
    """What a panel's queries returned: lines for a time series, rows for a table."""

    lines: list[Line] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


def legend_text(legend_format: str, labels: Mapping[str, str]) -> str:
    """Grafana's ``{{label}}`` legend substitution."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), legend_format)


def format_value(value: float, unit: str) -> str:
    """A value in the panel's unit, as Grafana would abbreviate it."""
    if unit == "bytes":
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(value) < 1024 or suffix == "TiB":
                return f"{value:.0f} {suffix}" if suffix == "B" else f"{value:.2f} {suffix}"
            value /= 1024
    if unit == "s":
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.0f} s"
    return f"{value:g}"


def _dashed_refs(panel: dict[str, Any]) -> set[str]:
    return {
        o["matcher"]["options"]
        for o in panel.get("fieldConfig", {}).get("overrides", [])
        if o["matcher"]["id"] == "byFrameRefID"
        and any(p["id"] == "custom.lineStyle" and p["value"].get("fill") == "dash" for p in o["properties"])
    }


def _chart(panel: dict[str, Any], data: PanelData, width: int, height: int) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    lines = [line for line in data.lines if line.points]
    if not lines:
        return "<code>no data</code>"
    values = [v for line in lines for _, v in line.points]
    times = [t for line in lines for t, _ in line.points]
    low, high = min(min(values), 0.0), max(values) or 1.0
    start, end = min(times), max(times)
    span_t, span_v = (end - start) or 1.0, (high - low) or 1.0
    dashed = _dashed_refs(panel)
    paths = []
    for i, line in enumerate(lines):
        xy = " ".join(
            f"{(t - start) / span_t * width:.1f},{height - (v - low) / span_v * (height - 4) - 2:.1f}"
            for t, v in line.points
        )
        dash = ' stroke-dasharray="6 4"' if line.ref_id in dashed else ""
        paths.append(
            f'<polyline fill="none" stroke="{COLOURS[i % len(COLOURS)]}" stroke-width="1.6"{dash} points="{xy}"/>'
        )
    svg = (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<line x1="0" x2="{width}" y1="{height - 1}" y2="{height - 1}" stroke="#2c3235"/>{"".join(paths)}'
        f'<text x="2" y="10" fill="#8e8ea0" font-size="10">{escape(format_value(high, unit))}</text></svg>'
    )
    legend = "".join(
        f'<div class="legend"><span style="background:{COLOURS[i % len(COLOURS)]}"></span>{escape(line.legend)}'
        f"<em>{escape(format_value(line.points[-1][1], unit))}</em></div>"
        for i, line in enumerate(lines[:4])
    )
    more = f'<div class="legend"><em>and {len(lines) - 4} more</em></div>' if len(lines) > 4 else ""
    return svg + legend + more


def _table(data: PanelData) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in data.columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(v)}</td>" for v in row) + "</tr>" for row in data.rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _panel_box(panel: dict[str, Any], data: PanelData | None) -> str:
    pos = panel["gridPos"]
    width, height = pos["w"] * COLUMN_PX - GAP_PX, pos["h"] * ROW_PX - GAP_PX
    style = f"left:{pos['x'] * COLUMN_PX}px;top:{pos['y'] * ROW_PX}px;width:{width}px;height:{height}px"
    if panel["type"] == "row":
        return f'<div class="panel row" style="{style}"><b>{escape(panel["title"])}</b></div>'
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    if data is None:
        body = "".join(
            f"<code>{escape(t.get('legendFormat') or t['refId'])}: {escape(' '.join(t['expr'].split()))}</code>"
            for t in panel.get("targets", [])
        )
    elif panel["type"] == "table":
        body = _table(data)
    else:
        legend_rows = min(len(data.lines), 5)
        body = _chart(panel, data, width - 18, max(height - 34 - 15 * legend_rows, 40))
    return (
        f'<div class="panel" style="{style}"><b>{escape(panel["title"])}</b>'
        f"<i>{escape(panel['type'])} · {escape(unit)}</i>{body}</div>"
    )


def layout_html(dashboard: dict[str, Any], data: Mapping[str, PanelData] | None = None) -> str:
    """The page of one dashboard JSON document; ``data`` maps panel titles to what their queries returned."""
    panels: Sequence[dict[str, Any]] = dashboard["panels"]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    variables = " · ".join(f"${v['name']}" for v in dashboard["templating"]["list"])
    boxes = "".join(_panel_box(p, None if data is None else data.get(p["title"], PanelData())) for p in panels)
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><style>{_STYLE}</style></head><body>'
        f"<h1>{escape(dashboard['title'])}</h1><p class=vars>variables: {escape(variables)}</p>"
        f'<div class="grid" style="height:{bottom * ROW_PX}px;width:{24 * COLUMN_PX}px">{boxes}</div>'
        "</body></html>\n"
    )


def page_size(dashboard: dict[str, Any]) -> tuple[int, int]:
    """Width and height in pixels a screenshot of the page needs."""
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    return 24 * COLUMN_PX + 24, bottom * ROW_PX + 70


if __name__ == "__main__":
    document = json.loads(Path(sys.argv[1]).read_text())
    sys.stdout.write(layout_html(document))
