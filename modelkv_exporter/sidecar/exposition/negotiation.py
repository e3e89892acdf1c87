"""Content negotiation for /metrics: OpenMetrics by ``Accept``, gzip by ``Accept-Encoding``."""

from __future__ import annotations

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def _items(header: str | None) -> list[tuple[str, str]]:
    items = []
    for item in (header or "").split(","):
        token, _, params = item.strip().partition(";")
        items.append((token.strip().lower(), params.strip().lower()))
    return items


def accepts_gzip(accept_encoding: str | None) -> bool:
    """True when ``Accept-Encoding`` lists gzip with a non-zero quality."""
    for token, params in _items(accept_encoding):
        if token not in ("gzip", "x-gzip"):
            continue
        if params.startswith("q="):
            try:
                return float(params[2:]) > 0
            except ValueError:
                return False
        return True
    return False


def wants_openmetrics(accept: str | None) -> bool:
    """True when ``Accept`` lists the OpenMetrics text format (as Prometheus sends it), else the 0.0.4 text format."""
    return any(token == "application/openmetrics-text" for token, _ in _items(accept))
