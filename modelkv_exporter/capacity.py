"""Capacity arithmetic over a snapshot's declarations: the peak at any max_num_seqs, and what fits."""

from __future__ import annotations

import re
from dataclasses import dataclass

from modelkv_exporter import arithmetic
from modelkv_exporter.snapshot import Snapshot

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``2GiB``, ``512MiB``, ``1.5G``, ``1000000`` -> bytes."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a size such as 1073741824, 512MiB or 2GiB")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "").lower()])


def declared_peak_at(snapshot: Snapshot, max_num_seqs: int) -> int:
    """The engine's declared peak bytes if it ran with ``max_num_seqs``."""
    return sum(
        d.bytes_per_row * arithmetic.row_count(d.rows, d.rows_fixed, max_num_seqs) for d in snapshot.declarations
    )


@dataclass(frozen=True)
class Fit:
    """The largest max_num_seqs whose declared peak fits a budget.

    ``max_num_seqs`` is None when nothing depends on it (every declaration is
    FIXED) and the fixed part fits; 0 when even one sequence does not fit.
    """

    max_num_seqs: int | None
    fixed_bytes: int
    per_sequence_bytes: int


def largest_fitting(snapshot: Snapshot, budget: int) -> Fit:
    """Solve fixed + per_sequence x n <= budget for the largest n >= 1."""
    fixed = sum(d.peak_bytes for d in snapshot.declarations if d.rows == arithmetic.FIXED)
    per_sequence = snapshot.per_sequence_bytes
    if fixed > budget:
        return Fit(0, fixed, per_sequence)
    if per_sequence == 0:
        return Fit(None, fixed, per_sequence)
    return Fit((budget - fixed) // per_sequence, fixed, per_sequence)
