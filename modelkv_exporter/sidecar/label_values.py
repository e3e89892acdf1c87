"""The words of the metrics that only the sidecar speaks: label values and sources beside the catalogue.

What a snapshot itself carries (scopes, row drivers, measured-memory sources) is the contract's
(``contract.vocabulary``); what the sidecar adds to it is here: how the root module's owner is
labelled, which sources growth is measured from, and why the HTTP server refused a client.
"""

from __future__ import annotations

from enum import Enum

ROOT_OWNER = "(root)"
"""How a declaration owned by the model's root module (owner path "") is shown and labelled."""

GROWTH_SOURCES: tuple[str, ...] = ("process_gpu", "torch_reserved", "process_resident")
"""Sources an engine's memory growth is measured from, most complete first; the rules and the landing page agree."""


class Refusal(str, Enum):
    """Why the HTTP server refused a request or cut a connection short: the ``reason`` label of
    ``modelkv_exporter_http_refusals_total``. Counted, never logged one by one."""

    INVALID_REQUEST = "invalid_request"
    """400: the request could not be parsed."""

    REQUEST_LINE = "request_line_too_long"
    """414: the request target is longer than ``--http-max-line-bytes``."""

    HEADERS = "headers_too_large"
    """431: a header line, the number of headers or the whole head is over its limit."""

    HEADER_TIMEOUT = "header_timeout"
    """408: the head was not complete ``--http-header-timeout`` seconds after its first byte."""

    BODY = "body_too_large"
    """413: a request body over ``--http-max-body-bytes`` (no route reads a body)."""

    BODY_NOT_READ = "body_not_read"
    """Closed instead of reading and dropping more than ``--http-max-body-bytes`` of an unread body."""

    CONNECTIONS = "too_many_connections"
    """Closed at once, unread and unanswered: ``--http-max-connections`` open and none of them idle."""

    EVICTED = "evicted_idle"
    """An idle keep-alive connection closed to make room for a new one."""

    SILENT = "silent_connection"
    """Closed: no request ``--http-idle-timeout`` seconds after the connection was made."""

    SEND_TIMEOUT = "send_timeout"
    """Aborted: the client had not taken its response ``--http-send-timeout`` seconds after it was written."""

    UNSENT = "unsent_bytes"
    """Aborted: unfinished responses held more than ``--http-max-unsent-bytes`` of bodies (or of unsent
    bytes in their connections); the oldest (or the heaviest) was cut."""
