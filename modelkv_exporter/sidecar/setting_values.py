"""The kinds of value the sidecar's and the commands' settings take, parsed from a flag or a ``MODELKV_`` variable.

Each raises ``ValueError`` with a message naming what was wrong; the command names the flag or variable.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from modelkv_exporter.contract.settings import number, whole_number
from modelkv_exporter.sidecar.sizes import parse_bytes


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = whole_number(text)
    if value < 1:
        raise ValueError(f"{value} is not 1 or more")
    return value


def port_number(text: str) -> int:
    """A TCP port, 0 to 65535 (0 picks a free one)."""
    value = whole_number(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"{value} is not a port (0 to 65535)")
    return value


def non_negative_float(text: str) -> float:
    """A number >= 0."""
    value = number(text)
    if value < 0:
        raise ValueError(f"{text} is not 0 or more")
    return value


def positive_float(text: str) -> float:
    """A number > 0."""
    value = number(text)
    if value <= 0:
        raise ValueError(f"{text} is not more than 0")
    return value


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
