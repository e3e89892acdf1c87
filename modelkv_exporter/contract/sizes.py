"""Byte sizes as people write and read them: ``512MiB`` in, ``35.5 MiB`` out.

Both unit families are read, each as it is defined, and only where the spelling says which:
``KiB``, ``MiB``, ``GiB``, ``TiB`` (also Kubernetes' ``Ki``, ``Mi``, ``Gi``, ``Ti``; any case) are
powers of 1024, the project's unit; ``kB``, ``MB``, ``GB``, ``TB`` (``KB`` too; a capital B) are
powers of 1000, so ``2GB`` is 2,000,000,000 bytes, about 1.86 GiB. Forms tools read differently
are refused, and the error says why and what to write instead: a bare ``2G`` (10^9 bytes to
Kubernetes, 2^30 to Docker and the JVM), ``2g``, ``2m`` (milli to Kubernetes) and a lowercase ``b``
(``2Gb``, ``2gb``: a bit). Sizes are printed in the binary units.
"""

from __future__ import annotations

import re

_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_DECIMAL = {"kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")
_NEGATIVE = re.compile(r"\s*-\s*\d")

SIZE_RULE = (
    "KiB, MiB, GiB, TiB are powers of 1024 (2GiB = 2147483648 bytes); kB, MB, GB, TB are powers of 1000 "
    "(2GB = 2000000000 bytes); 2G, 2g and 2Gb are refused as ambiguous"
)
"""How a size's unit is read, in the words every message and page about sizes uses."""


def _ambiguous(text: str, number: str, unit: str) -> str:
    """Why ``unit`` is refused, and the two sizes the writer may have meant."""
    letter = unit[0].upper()
    decimal, binary = ("k" if letter == "K" else letter) + "B", letter + "iB"
    powers = {"K": (3, 10), "M": (6, 20), "G": (9, 30), "T": (12, 40)}[letter]
    if unit == "m":
        why = "a bare m is milli to Kubernetes and mega elsewhere"
    elif len(unit) == 1:
        why = f"a bare {unit} is 10^{powers[0]} to Kubernetes but 2^{powers[1]} to Docker and the JVM"
    else:
        why = "a lowercase b is a bit, not a byte"
    bytes_decimal = int(float(number) * _DECIMAL[decimal])
    bytes_binary = int(float(number) * _BINARY[letter.lower() + "i"])
    return (
        f"{text!r} is ambiguous: {why}; write {number}{decimal} ({bytes_decimal} bytes) or {number}{binary} "
        f"({bytes_binary} bytes)"
    )


def parse_bytes(text: str) -> int:
    """``2GiB``, ``512MiB``, ``1.5GB``, ``1000000`` -> bytes; a negative, ambiguous or unreadable size is a
    ``ValueError`` that says which."""
    if _NEGATIVE.match(text):
        raise ValueError(f"{text!r} is negative: a size is a number of bytes, 0 or more, such as 512MiB or 2GiB")
    match = _SIZE.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a size such as 1073741824, 512MiB or 2GiB ({SIZE_RULE})")
    number, unit = match.groups()
    if unit in ("", "B"):
        factor = 1
    elif unit in _DECIMAL:
        factor = _DECIMAL[unit]
    elif unit.lower().removesuffix("b") in _BINARY:
        factor = _BINARY[unit.lower().removesuffix("b")]
    elif re.fullmatch(r"[kKmMgGtT][bB]?", unit):
        raise ValueError(_ambiguous(text, number, unit))
    else:
        raise ValueError(f"{text!r} is not a size such as 1073741824, 512MiB or 2GiB ({SIZE_RULE})")
    return int(float(number) * factor)


def human_bytes(value: int) -> str:
    """``37224448`` -> ``35.5 MiB``."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def signed_bytes(value: int, plus: str = "", minus: str = "−") -> str:
    """``human_bytes`` of a figure that may be negative: ``minus`` before a negative one, ``plus`` before any other
    (``"+"`` for a growth: ``+1.0 GiB``)."""
    return (minus if value < 0 else plus) + human_bytes(abs(value))
