"""Byte sizes as people write and read them: ``512MiB`` in, ``35.5 MiB`` out."""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``2GiB``, ``512MiB``, ``1.5G``, ``1000000`` -> bytes."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a size such as 1073741824, 512MiB or 2GiB")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "").lower()])


def human_bytes(value: int) -> str:
    """``37224448`` -> ``35.5 MiB``."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
