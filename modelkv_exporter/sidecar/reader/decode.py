"""Turn untrusted snapshot bytes into a ``Snapshot``, or a reasoned rejection.

Everything a hostile or broken writer can put in a file ends here as a
``SnapshotError`` with one of a few stable reasons (they become a metric label):
never another exception type, never a partially trusted document.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from enum import Enum
from typing import Any, NoReturn

from modelkv_exporter.contract import arithmetic
from modelkv_exporter.contract.snapshot import (
    MAX_NUM_SEQS_OPTIONAL,
    SCHEMA_VERSION,
    Declaration,
    DroppedDeclaration,
    EngineIdentity,
    EngineSettings,
    Measured,
    MemorySample,
    Observation,
    Snapshot,
)
from modelkv_exporter.contract.vocabulary import ROW_DRIVERS, SCOPES, RowDriver

MAX_INT = 2**63 - 1
MAX_ENGINE_ID_CHARS = 256
SOURCE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


class RejectReason(str, Enum):
    """Why a spool file was not exported. The values are metric label values."""

    TOO_LARGE = "too_large"
    NOT_REGULAR_FILE = "not_regular_file"
    UNREADABLE = "unreadable"
    INVALID_JSON = "invalid_json"
    INVALID_SNAPSHOT = "invalid_snapshot"
    UNSUPPORTED_VERSION = "unsupported_version"
    DUPLICATE_ENGINE = "duplicate_engine"
    OVER_BUDGET = "over_budget"


class SnapshotError(Exception):
    """A snapshot that cannot be used, with a stable reason and a readable detail."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


def _invalid(where: str, problem: str) -> NoReturn:
    raise SnapshotError(RejectReason.INVALID_SNAPSHOT, f"{where}: {problem}")


def _reject_constant(token: str) -> NoReturn:
    raise ValueError(f"non-finite number {token} is not JSON")


class _Fields:
    """Typed, bounded access to one JSON object; unknown keys are ignored."""

    def __init__(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            _invalid(where, f"expected an object, got {type(value).__name__}")
        self._data = value
        self.where = where

    def _get(self, key: str, required: bool) -> Any:
        value = self._data.get(key)
        if value is None and required:
            _invalid(f"{self.where}.{key}", "required field is missing")
        return value

    def integer(self, key: str, *, required: bool = True, minimum: int = 0) -> Any:
        value = self._get(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            _invalid(f"{self.where}.{key}", f"expected an integer, got {type(value).__name__}")
        if not minimum <= value <= MAX_INT:
            _invalid(f"{self.where}.{key}", f"{value} is outside [{minimum}, 2^63-1]")
        return value

    def number(self, key: str, *, required: bool = True) -> Any:
        value = self._get(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _invalid(f"{self.where}.{key}", f"expected a number, got {type(value).__name__}")
        if not math.isfinite(value) or value < 0 or value > 1e15:
            _invalid(f"{self.where}.{key}", f"{value!r} is not a finite number in [0, 1e15]")
        return float(value)

    def text(self, key: str, *, required: bool = True) -> Any:
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, str):
            _invalid(f"{self.where}.{key}", f"expected a string, got {type(value).__name__}")
        return value.encode("utf-8", "replace").decode("utf-8")

    def boolean(self, key: str) -> bool:
        value = self._data.get(key, False)
        if not isinstance(value, bool):
            _invalid(f"{self.where}.{key}", f"expected true or false, got {type(value).__name__}")
        return value

    def child(self, key: str, *, required: bool = True) -> _Fields | None:
        value = self._get(key, required)
        return None if value is None else _Fields(value, f"{self.where}.{key}")

    def items(self, key: str, parse: Callable[[Any, str], Any]) -> tuple[Any, ...]:
        value = self._get(key, True)
        if not isinstance(value, list):
            _invalid(f"{self.where}.{key}", f"expected a list, got {type(value).__name__}")
        return tuple(parse(item, f"{self.where}.{key}[{i}]") for i, item in enumerate(value))

    def mapping(self) -> dict[str, Any]:
        return self._data


def _engine(fields: _Fields) -> EngineIdentity:
    engine_id = fields.text("engine_id")
    if not engine_id or len(engine_id) > MAX_ENGINE_ID_CHARS:
        _invalid("engine.engine_id", f"must be 1 to {MAX_ENGINE_ID_CHARS} characters")
    optional_text = ("model", "served_model_name", "architecture", "stage_name", "replica", "device", "hostname")
    optional_int = ("stage_id", "tp_rank", "pp_rank", "dp_rank", "local_device", "pid")
    return EngineIdentity(
        engine_id=engine_id,
        **{key: fields.text(key, required=False) for key in optional_text},
        **{key: fields.integer(key, required=False) for key in optional_int},
    )


def _settings(fields: _Fields, version: int) -> EngineSettings:
    utilization = fields.number("gpu_memory_utilization", required=False)
    if utilization is not None and utilization > 1:
        _invalid("settings.gpu_memory_utilization", f"{utilization} is above 1")
    return EngineSettings(
        max_num_seqs=fields.integer("max_num_seqs", minimum=1, required=version < MAX_NUM_SEQS_OPTIONAL),
        gpu_memory_utilization=utilization,
        paged_kv_bytes=fields.integer("paged_kv_bytes", required=False),
        paged_kv_blocks=fields.integer("paged_kv_blocks", required=False),
    )


def _declaration(value: Any, where: str) -> Declaration:
    f = _Fields(value, where)
    declaration = Declaration(
        owner=f.text("owner"),
        owner_class=f.text("owner_class"),
        name=f.text("name"),
        layers=f.integer("layers", minimum=1),
        kv_heads=f.integer("kv_heads", minimum=1),
        head_dim=f.integer("head_dim", minimum=1),
        dtype=f.text("dtype"),
        element_size=f.integer("element_size", minimum=1),
        physical_capacity_positions=f.integer("physical_capacity_positions", minimum=1),
        capacity_source=f.text("capacity_source"),
        scope=f.text("scope"),
        rows=f.text("rows"),
        rows_fixed=f.integer("rows_fixed", minimum=1),
        rows_reason=f.text("rows_reason", required=False) or "",
        allocation_note=f.text("allocation_note", required=False),
        bytes_per_row=f.integer("bytes_per_row"),
        row_count=f.integer("row_count", minimum=1),
        peak_bytes=f.integer("peak_bytes"),
    )
    if not declaration.name:
        _invalid(f"{where}.name", "must not be empty")
    if declaration.scope not in SCOPES:
        _invalid(f"{where}.scope", f"{declaration.scope!r} is not one of {sorted(SCOPES)}")
    if declaration.rows not in ROW_DRIVERS:
        _invalid(f"{where}.rows", f"{declaration.rows!r} is not one of {sorted(ROW_DRIVERS)}")
    return declaration


def _check_arithmetic(declaration: Declaration, max_num_seqs: int | None, where: str) -> None:
    if max_num_seqs is None and declaration.rows != RowDriver.FIXED.value:
        _invalid(f"{where}.rows", f"{declaration.rows!r} needs settings.max_num_seqs, which is absent")
    expected_row = arithmetic.bytes_per_row(
        layers=declaration.layers,
        kv_heads=declaration.kv_heads,
        head_dim=declaration.head_dim,
        positions=declaration.physical_capacity_positions,
        element_size=declaration.element_size,
    )
    expected_rows = arithmetic.row_count(declaration.rows, declaration.rows_fixed, max_num_seqs or 1)
    if declaration.bytes_per_row != expected_row:
        _invalid(f"{where}.bytes_per_row", f"{declaration.bytes_per_row} != geometry's {expected_row}")
    if declaration.row_count != expected_rows:
        _invalid(f"{where}.row_count", f"{declaration.row_count} != driver's {expected_rows}")
    if declaration.peak_bytes != expected_row * expected_rows:
        _invalid(f"{where}.peak_bytes", f"{declaration.peak_bytes} != {expected_row} x {expected_rows}")


def _dropped(value: Any, where: str) -> DroppedDeclaration:
    f = _Fields(value, where)
    reason = f.text("reason")
    if not SOURCE_NAME.fullmatch(reason):
        _invalid(f"{where}.reason", f"{reason[:80]!r} is not a plain name")
    return DroppedDeclaration(
        owner=f.text("owner"),
        owner_class=f.text("owner_class"),
        reason=reason,
        count=f.integer("count", minimum=1),
        error=f.text("error", required=False) or "",
    )


def _sample(fields: _Fields | None) -> MemorySample | None:
    if fields is None:
        return None
    values = fields.child("values")
    assert values is not None
    parsed: dict[str, int] = {}
    for source in values.mapping():
        if not SOURCE_NAME.fullmatch(source):
            _invalid(f"{values.where}", f"measurement source {source[:80]!r} is not a plain name")
        parsed[source] = values.integer(source)
    return MemorySample(sampled_at=fields.number("sampled_at"), values=parsed)


def _measured(fields: _Fields | None) -> Measured:
    if fields is None:
        return Measured()
    return Measured(
        current=_sample(fields.child("current", required=False)),
        baseline=_sample(fields.child("baseline", required=False)),
    )


def _observation(value: Any, where: str) -> Observation:
    """One owner's observation; the figures of an unavailable one are dropped (absent, never 0)."""
    f = _Fields(value, where)
    available = f.boolean("available")
    figures = ("peak_bytes", "recent_peak_bytes", "live_bytes", "cache_calls")
    return Observation(
        owner=f.text("owner"),
        owner_class=f.text("owner_class", required=False) or "",
        available=available,
        reason=f.text("reason", required=False),
        calls=f.integer("calls", required=False),
        **{key: f.integer(key, required=False) if available else None for key in figures},
    )


def _observations(root: _Fields) -> tuple[Observation, ...]:
    if root.mapping().get("observations") is None:
        return ()
    observations = root.items("observations", _observation)
    owners = [o.owner for o in observations]
    if len(set(owners)) != len(owners):
        _invalid("snapshot.observations", "an owner is observed twice")
    return observations


def decode_json(data: bytes) -> Any:
    """Strict JSON: UTF-8 only, no NaN or Infinity, bounded nesting and integer size."""
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:
        raise SnapshotError(RejectReason.INVALID_JSON, "nesting too deep") from None
    except ValueError as error:
        raise SnapshotError(RejectReason.INVALID_JSON, str(error)[:200]) from None


def snapshot_from_dict(document: Any) -> Snapshot:
    """Validate a decoded JSON document and build the ``Snapshot`` it describes."""
    root = _Fields(document, "snapshot")
    version = root.integer("schema_version", minimum=1)
    if version > SCHEMA_VERSION:
        raise SnapshotError(
            RejectReason.UNSUPPORTED_VERSION,
            f"schema_version {version} is newer than this sidecar reads ({SCHEMA_VERSION}); upgrade the sidecar",
        )
    engine = _engine(root.child("engine"))  # type: ignore[arg-type]
    settings = _settings(root.child("settings"), version)  # type: ignore[arg-type]
    declarations = root.items("declarations", _declaration)
    seen: set[tuple[str, str]] = set()
    for i, declaration in enumerate(declarations):
        where = f"snapshot.declarations[{i}]"
        _check_arithmetic(declaration, settings.max_num_seqs, where)
        key = (declaration.owner, declaration.name)
        if key in seen:
            _invalid(where, f"duplicate declaration {declaration.name!r} of owner {declaration.owner!r}")
        seen.add(key)
    interval = root.number("heartbeat_interval_seconds", required=False)
    started_at, heartbeat_at = root.number("started_at"), root.number("heartbeat_at")
    if started_at > heartbeat_at:
        _invalid("snapshot.started_at", f"{started_at!r} is after heartbeat_at {heartbeat_at!r}")
    dropped = (
        root.items("dropped_declarations", _dropped) if root.mapping().get("dropped_declarations") is not None else None
    )
    return Snapshot(
        engine=engine,
        settings=settings,
        declarations=declarations,
        started_at=started_at,
        heartbeat_at=heartbeat_at,
        measured=_measured(root.child("measured", required=False)),
        heartbeat_interval_seconds=interval,
        ended=root.boolean("ended"),
        writer=root.text("writer", required=False) or "",
        observations=_observations(root),
        dropped_declarations=dropped,
    )


def parse_snapshot(data: bytes) -> Snapshot:
    """Parse snapshot file bytes; raises ``SnapshotError`` and nothing else on bad input."""
    return snapshot_from_dict(decode_json(data))
