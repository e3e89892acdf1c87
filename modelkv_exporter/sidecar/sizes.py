"""Byte sizes as people write and read them: ``512MiB`` in, ``35.5 MiB`` out.

Both unit families are read, each as it is defined: ``KiB``, ``MiB``, ``GiB``, ``TiB`` (also
``Ki``, ``Mi``, ``Gi``, ``Ti``) are powers of 1024, the project's unit; ``kB``, ``MB``, ``GB``,
``TB`` (also ``k``, ``M``, ``G``, ``T``) are powers of 1000, so ``2GB`` is 2,000,000,000 bytes,
about 1.86 GiB. Case does not matter. Sizes are printed in the binary units.
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)
_NEGATIVE = re.compile(r"\s*-\s*\d")

SIZE_RULE = (
    "KiB, MiB, GiB, TiB are powers of 1024 (2GiB = 2147483648 bytes); kB, MB, GB, TB are powers of 1000 "
    "(2GB = 2000000000 bytes)"
)
"""How a size's unit is read, in the words every message and page about sizes uses."""


def parse_bytes(text: str) -> int:
    """``2GiB``, ``512MiB``, ``1.5G``, ``1000000`` -> bytes; a negative or unreadable size is a ``ValueError``."""
    if _NEGATIVE.match(text):
        raise ValueError(f"{text!r} is negative: a size is a number of bytes, 0 or more, such as 512MiB or 2GiB")
    match = _SIZE.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a size such as 1073741824, 512MiB or 2GiB ({SIZE_RULE})")
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
