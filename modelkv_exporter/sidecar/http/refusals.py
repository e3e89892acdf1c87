"""Why the HTTP server refused a request or cut a connection short: the label values of
``modelkv_exporter_http_refusals_total``. Counted, never logged one by one."""

from __future__ import annotations

from enum import Enum


class Refusal(str, Enum):
    """One reason; the value is the metric's ``reason`` label."""

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
