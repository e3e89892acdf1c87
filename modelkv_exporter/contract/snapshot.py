"""The snapshot: what one engine process publishes, as plain dataclasses.

Stdlib only: the sidecar reads these without torch or vLLM. The JSON form is
documented in ``docs/snapshot-format.md`` and ``docs/snapshot.schema.json``;
``decode`` turns untrusted JSON back into these classes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modelkv_exporter.contract.vocabulary import RowDriver

SCHEMA_VERSION = 2
"""The newest ``schema_version`` this package reads and writes.

Bumped only by an incompatible change; additive fields keep the version. A document is
written with the oldest version whose readers read it right (``Snapshot.schema_version``), so
a sidecar that predates a bump keeps reading every document that does not need it.
"""

MAX_NUM_SEQS_OPTIONAL = 2
"""The first version in which ``settings.max_num_seqs`` may be absent (an engine without one)."""


@dataclass(frozen=True)
class EngineIdentity:
    """Who the engine process is. Every field but ``engine_id`` is optional."""

    engine_id: str
    model: str | None = None
    served_model_name: str | None = None
    architecture: str | None = None
    stage_id: int | None = None
    stage_name: str | None = None
    replica: str | None = None
    tp_rank: int | None = None
    pp_rank: int | None = None
    dp_rank: int | None = None
    local_device: int | None = None
    device: str | None = None
    hostname: str | None = None
    pid: int | None = None

    @property
    def model_label(self) -> str:
        """The model as operators name it: served name first, else the model path."""
        return self.served_model_name or self.model or ""

    @property
    def stage_label(self) -> str:
        """The vLLM-Omni stage name, else its id, else empty."""
        if self.stage_name:
            return self.stage_name
        return "" if self.stage_id is None else str(self.stage_id)

    @property
    def ranks_label(self) -> str:
        """Parallel ranks in one compact label, e.g. ``tp0-pp0-dp0``; unknown ranks omitted."""
        parts = [
            f"{prefix}{rank}"
            for prefix, rank in (("tp", self.tp_rank), ("pp", self.pp_rank), ("dp", self.dp_rank))
            if rank is not None
        ]
        return "-".join(parts)


@dataclass(frozen=True)
class EngineSettings:
    """Engine settings that give declarations and memory their meaning.

    ``max_num_seqs`` is None when the engine has no such setting or does not say; its
    declarations are then all ``FIXED``.
    """

    max_num_seqs: int | None
    gpu_memory_utilization: float | None = None
    paged_kv_bytes: int | None = None
    paged_kv_blocks: int | None = None


@dataclass(frozen=True)
class Declaration:
    """One declared cache, resolved at the engine's ``max_num_seqs``."""

    owner: str
    owner_class: str
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    element_size: int
    physical_capacity_positions: int
    capacity_source: str
    scope: str
    rows: str
    rows_fixed: int
    rows_reason: str
    allocation_note: str | None
    bytes_per_row: int
    row_count: int
    peak_bytes: int


@dataclass(frozen=True)
class DroppedDeclaration:
    """Declarations of one owner that the engine could not publish, and why."""

    owner: str
    owner_class: str
    reason: str
    count: int
    error: str = ""


@dataclass(frozen=True)
class MemorySample:
    """Measured bytes by source at one instant; a source that was not measured is absent."""

    sampled_at: float
    values: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Measured:
    """The latest sample and the post-initialisation baseline, each absent until taken."""

    current: MemorySample | None = None
    baseline: MemorySample | None = None


def _sample_dict(sample: MemorySample | None) -> dict[str, Any] | None:
    return None if sample is None else {"sampled_at": sample.sampled_at, "values": dict(sample.values)}


@dataclass(frozen=True)
class Snapshot:
    """One engine process's complete published state."""

    engine: EngineIdentity
    settings: EngineSettings
    declarations: tuple[Declaration, ...]
    started_at: float
    heartbeat_at: float
    measured: Measured = field(default_factory=Measured)
    heartbeat_interval_seconds: float | None = None
    ended: bool = False
    writer: str = ""
    dropped_declarations: tuple[DroppedDeclaration, ...] | None = None
    """Declarations the engine could not publish; None when the writer does not report them (older hooks)."""

    @property
    def schema_version(self) -> int:
        """The oldest version whose readers read this snapshot right: 1, or 2 without ``max_num_seqs``.

        A version-1 sidecar requires ``max_num_seqs``; given a document without it, it must
        say "upgrade the sidecar" (``unsupported_version``), not "invalid snapshot".
        """
        return SCHEMA_VERSION if self.settings.max_num_seqs is None else 1

    @property
    def declared_peak_bytes(self) -> int:
        """Sum of every declaration's peak bytes."""
        return sum(d.peak_bytes for d in self.declarations)

    @property
    def dropped_count(self) -> int | None:
        """How many declarations the engine dropped (a declarer that raised counts once); None when unreported."""
        if self.dropped_declarations is None:
            return None
        return sum(d.count for d in self.dropped_declarations)

    @property
    def per_sequence_bytes(self) -> int:
        """Bytes one more in-flight sequence adds: rows per MAX_NUM_SEQS declaration."""
        return sum(d.bytes_per_row for d in self.declarations if d.rows == RowDriver.MAX_NUM_SEQS.value)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form documented in docs/snapshot-format.md.

        Built field by field from each dataclass's ``__dict__``: every value is
        immutable, and ``dataclasses.asdict`` (which deep-copies every leaf) made a
        heartbeat of 100 declarations cost 4 ms.
        """
        return {
            "schema_version": self.schema_version,
            "engine": dict(vars(self.engine)),
            "settings": dict(vars(self.settings)),
            "declarations": [dict(vars(d)) for d in self.declarations],
            "started_at": self.started_at,
            "heartbeat_at": self.heartbeat_at,
            "measured": {
                "current": _sample_dict(self.measured.current),
                "baseline": _sample_dict(self.measured.baseline),
            },
            "heartbeat_interval_seconds": self.heartbeat_interval_seconds,
            "ended": self.ended,
            "writer": self.writer,
            "dropped_declarations": None
            if self.dropped_declarations is None
            else [dict(vars(d)) for d in self.dropped_declarations],
        }

    def to_json(self) -> bytes:
        """Compact UTF-8 JSON; non-finite floats are refused rather than written."""
        return json.dumps(self.to_dict(), allow_nan=False, separators=(",", ":")).encode("utf-8")
