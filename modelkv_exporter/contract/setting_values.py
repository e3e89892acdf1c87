"""The kinds of value settings take, each parsed from a flag's or a ``MODELKV_`` variable's text: one module for
both sides (the engine's settings and the sidecar's and the commands').

Each raises ``ValueError`` with a message naming what was wrong; the program names the flag or variable.
"""

from __future__ import annotations

import math
from typing import TypeVar
from urllib.parse import urlsplit

from modelkv_exporter.contract.sizes import parse_bytes

N = TypeVar("N", int, float)

MIN_INTERVAL_SECONDS = 1.0
"""The shortest interval between two samples or two censuses an engine takes."""


def number(text: str) -> float:
    """A finite number."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def whole_number(text: str) -> int:
    """A whole number."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def _within(value: N, holds: bool, shown: object, bound: str) -> N:
    """``value`` where ``holds``, else the error that says ``shown`` is not ``bound``."""
    if not holds:
        raise ValueError(f"{shown} is not {bound}")
    return value


def positive_int(text: str) -> int:
    """A whole number, 1 or more."""
    value = whole_number(text)
    return _within(value, value >= 1, value, "1 or more")


def non_negative_int(text: str) -> int:
    """A whole number, 0 or more."""
    value = whole_number(text)
    return _within(value, value >= 0, value, "0 or more")


def port_number(text: str) -> int:
    """A TCP port, 0 to 65535 (0 picks a free one)."""
    value = whole_number(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"{value} is not a port (0 to 65535)")
    return value


def non_negative_float(text: str) -> float:
    """A number, 0 or more."""
    value = number(text)
    return _within(value, value >= 0, text, "0 or more")


def positive_float(text: str) -> float:
    """A number above 0."""
    value = number(text)
    return _within(value, value > 0, text, "more than 0")


def interval_seconds(text: str) -> float:
    """Seconds between two samples or censuses: a number, raised to ``MIN_INTERVAL_SECONDS`` when below it."""
    return max(MIN_INTERVAL_SECONDS, number(text))


def switch(text: str) -> bool:
    """On or off: 1, true, yes, on; 0, false, no, off (any case)."""
    value = text.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is neither on (1, true, yes, on) nor off (0, false, no, off)")


def log_level(text: str) -> str:
    """One of Python's logging level names."""
    value = text.lower()
    if value not in ("critical", "error", "warning", "info", "debug"):
        raise ValueError(f"{text} is not a log level (critical, error, warning, info or debug)")
    return value


def web_address(text: str) -> str:
    """An absolute http or https address without a fragment, or empty (none)."""
    value = text.strip()
    if not value:
        return ""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.fragment or "#" in value:
        raise ValueError(
            f"{text!r} is not an absolute http(s) address without a #fragment, such as "
            "https://wiki.example.com/modelkv/runbook.md"
        )
    return value


def byte_size(text: str) -> int:
    """A size in bytes above 0: 1073741824, 512MiB, 2GiB."""
    value = parse_bytes(text)
    if value < 1:
        raise ValueError(f"{text!r} is not a size above 0 bytes")
    return value
