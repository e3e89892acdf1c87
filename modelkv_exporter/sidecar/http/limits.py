"""The limits the HTTP server holds every client to (each a setting; defaults in ``contract.limits``)."""

from __future__ import annotations

from dataclasses import dataclass

from modelkv_exporter.contract import limits

LINGER_SECONDS = 1.0
"""After an error answer: how long the request's remaining bytes are read and dropped, so the client
reads the status instead of a reset."""


@dataclass(frozen=True)
class HttpLimits:
    """What one connection may send, how long it may take, and how many connections may be open."""

    max_connections: int = limits.HTTP_MAX_CONNECTIONS
    max_line_bytes: int = limits.HTTP_MAX_LINE_BYTES
    max_header_bytes: int = limits.HTTP_MAX_HEADER_BYTES
    max_headers: int = limits.HTTP_MAX_HEADERS
    max_body_bytes: int = limits.HTTP_MAX_BODY_BYTES
    header_timeout: float = limits.HTTP_HEADER_TIMEOUT
    idle_timeout: float = limits.HTTP_IDLE_TIMEOUT
    send_timeout: float = limits.HTTP_SEND_TIMEOUT
    max_unsent_bytes: int = limits.HTTP_MAX_UNSENT_BYTES
