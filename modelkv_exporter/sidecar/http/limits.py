"""The limits the HTTP server holds every client to, each a setting (``--http-...``, ``MODELKV_HTTP_...``).

``docs/reliability.md`` measures the memory they bound against the sidecar's 192 MiB limit in
``deploy/kubernetes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelkv_exporter.contract.setting_values import byte_size, positive_float, positive_int
from modelkv_exporter.contract.settings import setting

LINGER_SECONDS = 1.0
"""After an error answer: how long the request's remaining bytes are read and dropped, so the client
reads the status instead of a reset."""


@dataclass(frozen=True)
class HttpLimits:
    """What one connection may send, how long it may take, and how many connections may be open."""

    max_connections: int = setting(
        256, positive_int, "Open HTTP connections; a new one closes the longest-idle, else it is closed unanswered."
    )
    max_line_bytes: int = setting(8 * 1024, byte_size, "Longest request line (else 414) and header line (else 431).")
    max_header_bytes: int = setting(
        64 * 1024, byte_size, "Longest request head, request line and headers together (else 431)."
    )
    """Prometheus sends under 1 KiB, 5 KiB with a bearer token."""

    max_headers: int = setting(100, positive_int, "Most header lines in a request (else 431).")
    max_body_bytes: int = setting(
        64 * 1024,
        byte_size,
        "Largest request body: a larger declared one is answered 413, an unread one is dropped up to this size, "
        "beyond it the connection is closed.",
    )
    """No route reads a body."""

    header_timeout: float = setting(
        10.0, positive_float, "Seconds from a request head's first byte to its end (else 408)."
    )
    """However slowly the bytes come."""

    idle_timeout: float = setting(
        5.0, positive_float, "Seconds a connection may wait for its next request before it is closed."
    )
    """uvicorn's keep-alive default."""

    send_timeout: float = setting(
        30.0, positive_float, "Seconds a client has to take a response; then the connection is aborted."
    )
    max_unsent_bytes: int = setting(
        32 * 1024 * 1024,
        byte_size,
        "Bytes held for responses clients have not taken yet (distinct bodies, and unsent bytes in connections); "
        "past it the oldest response (or the connection holding the most) is aborted.",
    )
    """All connections together."""
