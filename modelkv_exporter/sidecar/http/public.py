"""What HTTP clients are shown of the spool: visible text, printable file names, no paths, no OS errors.

Snapshot text can hold control characters, bidi overrides (U+202E) and other invisible format
characters that make a page or a terminal show something else than the data; file names can
hold bytes that are not UTF-8. Pages show them as visible escapes, the JSON API escapes every
non-ASCII character (lossless), and why the sidecar could not read a file or list the spool is
in its log, not in a response.
"""

from __future__ import annotations

import json
from typing import Any

from modelkv_exporter.contract.decode import RejectReason, SnapshotError

UNREADABLE_DETAIL = "the file could not be read (the sidecar's log says why)"
SPOOL_UNREADABLE = "the spool directory could not be listed (the sidecar's log says why)"


def _escape_char(ch: str) -> str:
    if 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte of a file name that is not UTF-8 (surrogateescape)
        return f"\\x{ord(ch) - 0xDC00:02x}"
    return ch.encode("unicode_escape").decode("ascii")


def visible(text: str) -> str:
    """``text`` with every unprintable character (controls, bidi and format characters, separators,
    lone surrogates, undecodable file-name bytes) written as a visible backslash escape."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape_char(ch) for ch in text)


def public_detail(error: SnapshotError) -> str:
    """The detail of a rejection as a client may see it: OS error text stays in the log."""
    if error.reason is RejectReason.UNREADABLE:
        return UNREADABLE_DETAIL
    return error.detail


def json_body(document: Any) -> bytes:
    """Compact JSON, ASCII only: control, bidi and every other non-ASCII character escaped as ``\\uXXXX``."""
    return json.dumps(document, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")
