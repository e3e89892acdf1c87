"""Text that is safe to show people and clients: unprintable characters escaped, no paths, no OS errors.

Snapshot text can hold control characters, bidi overrides (U+202E) and other invisible format
characters that make a page or a terminal show something else than the data; file names can
hold bytes that are not UTF-8. Pages show them as visible escapes, the JSON API writes them as
``\\uXXXX`` escapes (lossless), and why the sidecar could not read a file or list the spool is
in its log, not in a response.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import unicodedata
from typing import Any

from modelkv_exporter.sidecar.reader.decode import RejectReason, SnapshotError

UNREADABLE_DETAIL = "the file could not be read (the sidecar's log says why)"
SPOOL_UNREADABLE = "the spool directory could not be listed (the sidecar's log says why)"


def _escape_char(ch: str) -> str:
    if 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte of a file name that is not UTF-8 (surrogateescape)
        return f"\\x{ord(ch) - 0xDC00:02x}"
    return ch.encode("unicode_escape").decode("ascii")


def printable(text: str) -> str:
    """``text`` with every unprintable character (controls, bidi and format characters, separators,
    lone surrogates, undecodable file-name bytes) written as a visible backslash escape."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape_char(ch) for ch in text)


def client_detail(error: SnapshotError) -> str:
    """The detail of a rejection as a client may see it: OS error text stays in the log."""
    if error.reason is RejectReason.UNREADABLE:
        return UNREADABLE_DETAIL
    return error.detail


@functools.cache
def _invisible() -> re.Pattern[str]:
    """Every control, format (bidi, zero-width), surrogate and line or paragraph separator character (built once)."""
    hidden = ("Cc", "Cf", "Cs", "Zl", "Zp")
    chars = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) in hidden]
    return re.compile("[" + "".join(re.escape(ch) for ch in chars) + "]")


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_body(document: Any) -> bytes:
    """Compact UTF-8 JSON whose control, format (bidi), surrogate and separator characters are ``\\uXXXX``
    escapes: the same data for any JSON reader, nothing invisible or reordering for a person or terminal."""
    text = json.dumps(document, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return _invisible().sub(_json_escape, text).encode()
