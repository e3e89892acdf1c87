"""Why an engine died and what its memory was then: the post-mortem of one snapshot, in one definition.

An engine that ended for a reason other than ``shutdown`` (``Snapshot.end``: ``out_of_memory``, ``error``, or
any other plain name a newer writer sends) and one that vanished (stale, its liveness lock held by no process:
killed by SIGKILL or the kernel's OOM killer) leave a post-mortem until the sidecar forgets them. /metrics
(``modelkv_engine_ended_timestamp_seconds`` and the two figures beside it), the landing page, ``inspect``, the
JSON document and ``ModelKVEngineOutOfMemory`` read it from here. Its memory is the snapshot's last sample: for
an engine that ended itself, taken while the error propagated; for a vanished one, its last heartbeat. What grew
is ``sidecar.growth``'s (``grown_parts``), by part of the process ``sidecar.breakdown``'s.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from modelkv_exporter.contract.sizes import human_bytes
from modelkv_exporter.contract.snapshot import Snapshot, TorchSegment
from modelkv_exporter.contract.vocabulary import EndReason
from modelkv_exporter.sidecar.breakdown import Breakdown, breakdown, parts_text
from modelkv_exporter.sidecar.growth import grown_parts, growth
from modelkv_exporter.sidecar.reader.state import EngineState, died

SEGMENTS_SHOWN = 4
"""Torch's largest segments a page or report lists (a snapshot holds at most 8)."""


@dataclass(frozen=True)
class PostMortem:
    """Why one engine died, when, and its memory at that moment (None: not known)."""

    reason: str
    """``out_of_memory``, ``error``, ``vanished`` (told by the sidecar), or a newer writer's plain name."""
    at: float
    """When it ended (a vanished engine: its last heartbeat, the last moment it is known to have run)."""
    error: str
    """The exception's qualified type and first line (empty where none is known)."""
    grown: Mapping[str, int]
    """Growth since the baseline by part (``growth.grown_parts``); empty where not measured."""
    parts: Breakdown | None
    """The process's memory by part at that moment."""
    reserved_free_bytes: int | None
    """What torch's caching allocator held reserved and free at that moment."""
    largest_segments: tuple[TorchSegment, ...] | None
    """Torch's largest segments then, largest first."""

    @property
    def largest_grown(self) -> tuple[str, int] | None:
        """The part that grew most since the baseline, or None where nothing grew or it is not measured."""
        if not self.grown:
            return None
        part, grown = max(self.grown.items(), key=lambda item: item[1])
        return (part, grown) if grown > 0 else None

    @property
    def out_of_memory(self) -> bool:
        """Whether the engine raised an out-of-memory error."""
        return self.reason == EndReason.OUT_OF_MEMORY.value

    def headline(self) -> str:
        """One line: why it ended and what grew most, e.g. ``ended out_of_memory (torch.OutOfMemoryError: ...):
        live_tensors grew 6.0 GiB since baseline``."""
        words = "killed without ending its snapshot" if self.reason == "vanished" else f"ended {self.reason}"
        grown = self.largest_grown
        what = f"{grown[0]} grew {human_bytes(grown[1])} since baseline" if grown else "growth since baseline unknown"
        error = f" ({self.error})" if self.error else ""
        return f"{words}{error}: {what}"

    def document(self) -> dict[str, object]:
        """The post-mortem as ``/api/v1/engines`` gives it (the snapshot's ``end`` is beside it, as written)."""
        grown = self.largest_grown
        return {
            "reason": self.reason,
            "at": self.at,
            "error": self.error,
            "grew_most": None if grown is None else {"part": grown[0], "bytes": grown[1]},
            "growth_by_part": dict(self.grown),
            "reserved_free_bytes": self.reserved_free_bytes,
        }


def post_mortem(snapshot: Snapshot, state: EngineState) -> PostMortem | None:
    """The post-mortem of an engine in ``state``: one that vanished, or ended for a reason other than ``shutdown``
    (not yet forgotten); None for any other (a clean shutdown, an older writer's end without a reason)."""
    end = snapshot.end
    if state is EngineState.VANISHED:
        reason, at, error, free, segments = EndReason.VANISHED.value, snapshot.heartbeat_at, "", None, None
    elif state is EngineState.ENDED and end is not None and died(snapshot):
        reason, at, error, free, segments = end.reason, end.at, end.error, end.reserved_free_bytes, end.largest_segments
    else:
        return None
    judged = growth(snapshot)
    return PostMortem(
        reason=reason,
        at=at,
        error=error,
        grown={} if judged is None else grown_parts(judged),
        parts=breakdown(snapshot),
        reserved_free_bytes=free,
        largest_segments=segments,
    )


def utc_time(at: float) -> str:
    """A Unix time as the page and ``inspect`` write it: ``2026-12-06 22:04:46 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def post_mortem_lines(dead: PostMortem) -> list[tuple[str, str]]:
    """The post-mortem as (heading, plain text) pairs, in the order the page and ``inspect`` print them."""
    reason = "vanished: its process is gone without ending its snapshot" if dead.reason == "vanished" else dead.reason
    when = ("last heartbeat " if dead.reason == "vanished" else "") + utc_time(dead.at)
    lines = [("reason", reason), ("when", when)]
    if dead.error:
        lines.append(("error", dead.error))
    grown = dead.largest_grown
    if grown is not None:
        lines.append(("grew most", f"{grown[0]} +{human_bytes(grown[1])} since baseline"))
    if dead.grown:
        ordered = sorted(dead.grown.items(), key=lambda item: -item[1])
        lines.append(("growth by part", ", ".join(f"{part} +{human_bytes(value)}" for part, value in ordered)))
    else:
        lines.append(("growth by part", "not measured (no baseline or no sample)"))
    if dead.parts is not None:
        lines.append(("memory then", parts_text(dead.parts)))
    if dead.reserved_free_bytes is not None:
        lines.append(("torch reserved, free", human_bytes(dead.reserved_free_bytes)))
    if dead.largest_segments:
        shown = dead.largest_segments[:SEGMENTS_SHOWN]
        segments = ", ".join(f"{human_bytes(s.total_bytes)} ({human_bytes(s.allocated_bytes)} in use)" for s in shown)
        more = len(dead.largest_segments) - len(shown)
        lines.append(("largest segments", segments + (f"; and {more} more" if more else "")))
    return lines
