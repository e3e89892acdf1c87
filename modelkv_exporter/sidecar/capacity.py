"""Capacity arithmetic over a snapshot: the peak at any max_num_seqs, and what fits in a given cache memory.

An engine's demand is a fixed part plus a part per sequence. ``Demand.declared`` takes both from
the declarations alone. ``Demand.expected`` also uses what each owner's caches were observed to
hold: an owner observed above its declared peak at the engine's own max_num_seqs has every one
of its declarations scaled by observed / declared. The observed peak is the most its caches held
at once, at whatever concurrency the engine ran, so the ratio is a lower bound on how far the
declaration under-reports; scaling both parts by it assumes the missing bytes grow as the declared
ones do (a left-out copy of a declared cache does). An owner that declares nothing but was observed
holding bytes adds them to the fixed part: how they grow with max_num_seqs is unknown. So does every
owner the engine discovered (``Snapshot.discovered``: a module holding cache memory it does not
declare, or more than its declared caches hold): its peak is added to the fixed part, never left out; an owner two
methods found (``cache_layer`` and ``census``) once, at the larger peak: both see the same memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from modelkv_exporter.contract.snapshot import DiscoveredOwner, Snapshot
from modelkv_exporter.contract.vocabulary import RowDriver
from modelkv_exporter.sidecar.discovered import discovery_running


@dataclass(frozen=True)
class Correction:
    """An owner whose caches were observed to hold more than it declares at the engine's max_num_seqs."""

    owner: str
    declared_bytes: int
    observed_bytes: int

    @property
    def ratio(self) -> Fraction | None:
        """Observed over declared; None when the owner declares nothing."""
        return Fraction(self.observed_bytes, self.declared_bytes) if self.declared_bytes else None


def corrections(snapshot: Snapshot) -> tuple[Correction, ...]:
    """Every owner observed (available, with a peak) to hold more than its declared peak, in owner order."""
    found = []
    for owner, observation in snapshot.owners().items():
        if observation is None or not observation.available or observation.peak_bytes is None:
            continue
        declared = snapshot.declared_peak_of(owner)
        if observation.peak_bytes > declared:
            found.append(Correction(owner, declared, observation.peak_bytes))
    return tuple(found)


@dataclass(frozen=True)
class Fit:
    """The largest max_num_seqs whose peak fits in a cache memory (``plan --cache-memory``).

    ``max_num_seqs`` is None when nothing depends on it (no per-sequence bytes) and the fixed
    part fits; 0 when the fixed part does not fit, or it does and one sequence more does not.
    """

    max_num_seqs: int | None
    fixed_bytes: int
    per_sequence_bytes: int


@dataclass(frozen=True)
class Demand:
    """Bytes an engine needs: ``fixed`` plus ``per_sequence`` for each of at least one sequence.

    ``corrections`` are the owners whose observed bytes replaced their declarations, ``undeclared``
    the discovered owners whose peaks were added to the fixed part (both empty for ``Demand.declared``).
    Fractions keep a scaled figure exact until it is rounded up to bytes.
    """

    fixed: Fraction
    per_sequence: Fraction
    corrections: tuple[Correction, ...] = ()
    undeclared: tuple[DiscoveredOwner, ...] = ()

    @classmethod
    def declared(cls, snapshot: Snapshot) -> Demand:
        """What the declarations alone say."""
        return cls._of(snapshot, (), ())

    @classmethod
    def expected(cls, snapshot: Snapshot) -> Demand:
        """The declarations, each owner observed above its declaration scaled up to what was observed, and every
        discovered owner's peak as fixed bytes."""
        discovered = snapshot.discovered if discovery_running(snapshot) else ()
        return cls._of(snapshot, corrections(snapshot), discovered)

    @classmethod
    def _of(cls, snapshot: Snapshot, found: tuple[Correction, ...], discovered: tuple[DiscoveredOwner, ...]) -> Demand:
        scale = {c.owner: c.ratio for c in found if c.ratio is not None}
        fixed = Fraction(sum(c.observed_bytes for c in found if c.ratio is None))
        most: dict[str, int] = {}
        for found_owner in discovered:
            most[found_owner.owner] = max(most.get(found_owner.owner, 0), found_owner.peak_bytes)
        fixed += sum(most.values())
        per_sequence = Fraction(0)
        for d in snapshot.declarations:
            factor = scale.get(d.owner, Fraction(1))
            if d.rows == RowDriver.FIXED.value:
                fixed += d.peak_bytes * factor
            else:
                per_sequence += d.bytes_per_row * factor
        return cls(fixed, per_sequence, found, discovered)

    @property
    def fixed_bytes(self) -> int:
        """The fixed part, rounded up to whole bytes."""
        return math.ceil(self.fixed)

    @property
    def per_sequence_bytes(self) -> int:
        """The part each sequence adds, rounded up to whole bytes."""
        return math.ceil(self.per_sequence)

    def peak_at(self, max_num_seqs: int) -> int:
        """The peak bytes if the engine ran with ``max_num_seqs`` (per-sequence caches keep at least one row)."""
        return math.ceil(self.fixed + self.per_sequence * max(1, max_num_seqs))

    def fit(self, cache_memory: int) -> Fit:
        """Solve fixed + per_sequence x n <= cache_memory for the largest n >= 1 (0 when none fits)."""
        fit = Fit(0, self.fixed_bytes, self.per_sequence_bytes)
        if self.fixed > cache_memory:
            return fit
        if self.per_sequence == 0:
            return Fit(None, fit.fixed_bytes, fit.per_sequence_bytes)
        return Fit(math.floor((cache_memory - self.fixed) / self.per_sequence), fit.fixed_bytes, fit.per_sequence_bytes)
