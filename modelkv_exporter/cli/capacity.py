"""Capacity arithmetic over a snapshot's declarations: the peak at any max_num_seqs, and what fits."""

from __future__ import annotations

from dataclasses import dataclass

from modelkv_exporter.contract import arithmetic
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.vocabulary import RowDriver


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
    fixed = sum(d.peak_bytes for d in snapshot.declarations if d.rows == RowDriver.FIXED.value)
    per_sequence = snapshot.per_sequence_bytes
    if fixed > budget:
        return Fit(0, fixed, per_sequence)
    if per_sequence == 0:
        return Fit(None, fixed, per_sequence)
    return Fit((budget - fixed) // per_sequence, fixed, per_sequence)
