"""Whether an owner's caches hold what it declares: one verdict from plain numbers, for tests and for a spool.

``judge`` is the one definition, shared by ``modelkv_exporter.testing`` (a model author's check,
engine side) and ``modelkv-exporter check`` (a running engine's spool, sidecar side).

Over-reporting is claimed only when the run is known to have reached the bound the declaration
is made for (``max_num_seqs`` rows, the declared positions): a run that holds less without
reaching it proves nothing, and from a running engine's spool that is never known.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class VerdictKind(str, Enum):
    """What an owner's observed caches say about its declaration."""

    HOLDS = "holds"
    """Its caches held exactly what it declares at ``max_num_seqs``."""

    UNDER_REPORTS = "under_reports"
    """Its caches held more than it declares."""

    OVER_REPORTS = "over_reports"
    """The run reached the declared bound and its caches held less than it declares."""

    NOT_REACHED = "not_reached"
    """Its caches held less than it declares, and the run is not known to have reached the bound."""

    UNDECLARED = "undeclared"
    """It declares nothing but its caches held memory."""

    UNUSED = "unused"
    """It declares caches, was called, and never created or used one."""

    HELD_ELSEWHERE = "held_elsewhere"
    """It declares caches it did not hold: it wrote a cache another module holds (which counts it)."""

    NOTHING = "nothing"
    """It declares nothing and held nothing."""

    UNKNOWN = "unknown"
    """Its caches could not be observed (or it was never called): nothing can be said."""


PASSING: frozenset[VerdictKind] = frozenset({VerdictKind.HOLDS, VerdictKind.NOT_REACHED, VerdictKind.NOTHING})
"""The verdicts a model author's check accepts."""


def byte_text(value: int) -> str:
    """``20316160`` -> ``20,316,160 B``."""
    return f"{value:,} B"


@dataclass(frozen=True)
class Verdict:
    """One owner's verdict, with the figures it was made from."""

    kind: VerdictKind
    declared_bytes: int
    observed_bytes: int | None
    detail: str = ""
    """Why it could not be observed (``UNKNOWN``), which bound the run did not reach (``NOT_REACHED``), or which
    module holds the cache it declares (``HELD_ELSEWHERE``)."""

    @property
    def ok(self) -> bool:
        """Whether a model author's check accepts it."""
        return self.kind in PASSING

    @property
    def factor(self) -> float | None:
        """Observed over declared (``UNDER_REPORTS``), or declared over observed (``OVER_REPORTS``)."""
        observed = self.observed_bytes
        if self.kind is VerdictKind.UNDER_REPORTS and observed is not None:
            return observed / self.declared_bytes
        if self.kind is VerdictKind.OVER_REPORTS and observed:
            return self.declared_bytes / observed
        return None

    @property
    def text(self) -> str:
        """The verdict as a sentence, figures included."""
        declared = byte_text(self.declared_bytes)
        observed = byte_text(self.observed_bytes or 0)
        factor = self.factor
        sentences = {
            VerdictKind.HOLDS: f"holds what it declares ({declared})",
            VerdictKind.UNDER_REPORTS: f"under-reports by {factor or 0:.2f}x: declares {declared}, held {observed}",
            VerdictKind.OVER_REPORTS: f"over-reports by {factor or 0:.2f}x: declares {declared}, held {observed} "
            "at its bound",
            VerdictKind.NOT_REACHED: f"held {observed} of the {declared} it declares; bound not reached",
            VerdictKind.UNDECLARED: f"declares nothing but held {observed}",
            VerdictKind.UNUSED: f"declared cache never used: declares {declared}, was called and held nothing",
            VerdictKind.HELD_ELSEWHERE: f"declares a cache another module holds: declares {declared}, held {observed}",
            VerdictKind.NOTHING: "declares nothing and held nothing",
            VerdictKind.UNKNOWN: "not observed",
        }
        sentence = sentences[self.kind]
        return f"{sentence} ({self.detail})" if self.detail else sentence


def holder_text(path: str, owner_class: str | None) -> str:
    """How a verdict names the module holding a cache another module wrote (``judge``'s ``held_by``)."""
    return f"{path or '(root)'!r} ({owner_class or 'unknown class'})"


def judge(
    *,
    declared_bytes: int,
    observed_bytes: int | None,
    calls: int | None,
    cache_calls: int | None,
    reached: bool | None,
    not_reached: str = "",
    unobserved: str = "",
    held_by: str = "",
) -> Verdict:
    """The verdict for one owner.

    ``declared_bytes``: the sum of its declared peaks at ``max_num_seqs`` (0: it declares nothing).
    ``observed_bytes``: the most its caches held at once (None: not observable, ``unobserved`` says why).
    ``calls``/``cache_calls``: calls into the owner, and those that used a cache (None: unknown).
    ``reached``: True when the run reached the declared bound, False when it did not, None when
    that is not known (a running engine); ``not_reached`` says which bound was missed.
    ``held_by``: the module holding a cache this owner wrote (a model author's check): holding less than it declares
    is then a declaration of that module's cache, which counts there (a cache counts once).
    """
    if observed_bytes is None:
        return Verdict(VerdictKind.UNKNOWN, declared_bytes, None, unobserved or "its caches could not be observed")
    if declared_bytes <= 0:
        kind = VerdictKind.UNDECLARED if observed_bytes > 0 else VerdictKind.NOTHING
        return Verdict(kind, 0, observed_bytes)
    if held_by and observed_bytes < declared_bytes:
        return Verdict(
            VerdictKind.HELD_ELSEWHERE,
            declared_bytes,
            observed_bytes,
            f"it wrote a cache that {held_by} holds, and a cache counts once, for the module that holds it: declare "
            f"it there, not here",
        )
    if observed_bytes == 0 and cache_calls == 0 and calls:
        return Verdict(VerdictKind.UNUSED, declared_bytes, 0, f"{calls} calls, none used a cache")
    if observed_bytes > declared_bytes:
        return Verdict(VerdictKind.UNDER_REPORTS, declared_bytes, observed_bytes)
    if observed_bytes == declared_bytes:
        return Verdict(VerdictKind.HOLDS, declared_bytes, observed_bytes)
    if reached:
        return Verdict(VerdictKind.OVER_REPORTS, declared_bytes, observed_bytes)
    detail = not_reached or (
        "not known whether the engine ran at its bound" if reached is None else "the run did not reach it"
    )
    return Verdict(VerdictKind.NOT_REACHED, declared_bytes, observed_bytes, detail)
