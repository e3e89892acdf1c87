"""Content negotiation for /metrics: OpenMetrics by ``Accept``, gzip by ``Accept-Encoding`` (RFC 9110, 12.5).

A quality of 0 is a refusal and is honoured wherever its parameter stands (``gzip;level=1;q=0``).
When a header names the same coding or media type twice, the lowest quality counts: a refusal
wins (``gzip;q=0, gzip;q=1`` refuses gzip). A coding the client refuses is never sent; when it
refuses every coding the sidecar has (``identity;q=0``, ``*;q=0``) the answer is 406. Parsing is
bounded: only the first ``MAX_ITEMS`` items of a header are read (the server bounds its length).
"""

from __future__ import annotations

from collections.abc import Iterator

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OPENMETRICS = "application/openmetrics-text"
GZIP = "gzip"
IDENTITY = "identity"
MAX_ITEMS = 64


def _quality(params: list[str]) -> float:
    """The ``q`` parameter among ``params`` (1 when absent); a malformed one counts as a refusal."""
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() != "q":
            continue
        try:
            q = float(value.strip())
        except ValueError:
            return 0.0
        return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def _items(header: str) -> Iterator[tuple[str, float]]:
    """``(token, quality)`` for each of the first ``MAX_ITEMS`` items of a header."""
    for item in header.split(",", MAX_ITEMS)[:MAX_ITEMS]:
        token, *params = item.split(";")
        token = token.strip().lower()
        if token:
            yield token, _quality(params)


def _qualities(header: str) -> dict[str, float]:
    """Each token's quality, the lowest where a token repeats."""
    found: dict[str, float] = {}
    for token, q in _items(header):
        found[token] = min(q, found.get(token, q))
    return found


def _match(qualities: dict[str, float], names: tuple[str, ...], default: float) -> float:
    """The quality of the most specific of ``names`` listed (exact names first, a wildcard last), else ``default``."""
    for name in names:
        if name in qualities:
            return qualities[name]
    return default


def choose_encoding(accept_encoding: str | None) -> str | None:
    """``"gzip"``, ``"identity"``, or None when the client refuses both (answer 406).

    No header means no preference: identity, as before negotiation (Prometheus always asks for gzip).
    gzip is chosen when acceptable and at least as preferred as identity.
    """
    if accept_encoding is None:
        return IDENTITY
    qualities = _qualities(accept_encoding)
    named = [qualities[name] for name in ("gzip", "x-gzip") if name in qualities]
    gzip = min(named) if named else qualities.get("*", 0.0)
    identity = _match(qualities, ("identity", "*"), 1.0)
    if gzip > 0 and gzip >= identity:
        return GZIP
    if identity > 0:
        return IDENTITY
    return None


def accepts_gzip(accept_encoding: str | None) -> bool:
    """True when gzip is the coding to send for ``Accept-Encoding``."""
    return choose_encoding(accept_encoding) == GZIP


def wants_openmetrics(accept: str | None) -> bool:
    """True when ``Accept`` names the OpenMetrics text format, not refused and at least as preferred as the
    0.0.4 text format (as Prometheus asks); wildcards alone get the text format."""
    if not accept:
        return False
    qualities = _qualities(accept)
    openmetrics = qualities.get(OPENMETRICS, 0.0)
    return openmetrics > 0 and openmetrics >= _match(qualities, ("text/plain", "text/*", "*/*"), 0.0)
