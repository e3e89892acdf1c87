"""Render a registry for one HTTP request: text format or OpenMetrics by ``Accept``, gzip by ``Accept-Encoding``."""

from __future__ import annotations

import gzip
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder


@dataclass(frozen=True)
class Rendered:
    """A response body and the headers that describe it."""

    body: bytes
    headers: dict[str, str]


def accepts_gzip(accept_encoding: str | None) -> bool:
    """True when ``Accept-Encoding`` lists gzip with a non-zero quality."""
    for item in (accept_encoding or "").split(","):
        token, _, params = item.strip().partition(";")
        if token.strip().lower() not in ("gzip", "x-gzip"):
            continue
        quality = params.strip().lower()
        if quality.startswith("q="):
            try:
                return float(quality[2:]) > 0
            except ValueError:
                return False
        return True
    return False


def render(registry: CollectorRegistry, accept: str | None, accept_encoding: str | None) -> Rendered:
    """Collect ``registry`` once and encode it the way the client asked."""
    encoder, content_type = choose_encoder(accept or "")
    body = encoder(registry)
    headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
    if accepts_gzip(accept_encoding):
        body = gzip.compress(body, compresslevel=6)
        headers["Content-Encoding"] = "gzip"
    return Rendered(body, headers)
