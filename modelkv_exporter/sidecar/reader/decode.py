"""Turn untrusted snapshot bytes into a ``Snapshot``, or a reasoned rejection.

Everything a hostile or broken writer can put in a file ends here as a
``SnapshotError`` with one of a few stable reasons (they become a metric label):
never another exception type, never a partially trusted document.

The shape and bounds of every field come from the snapshot dataclasses' declarations
(``contract/fields.py``): a reader per class is compiled from them once, and what makes a value
or a declaration valid is ``contract/validity.py``, the definition the engine applies to the
declarations it publishes. What a field declaration cannot say (the declared arithmetic,
uniqueness, timestamps in order, the version's own rules) is checked here, after the fields: the
snapshot's ``CHECKS_BEYOND_FIELDS``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from enum import Enum
from typing import Any, NoReturn

from modelkv_exporter.contract.fields import REQUIRED, FieldInfo, Rule, fields_of
from modelkv_exporter.contract.snapshot import SCHEMA_VERSION, VERSION_FIELD, Snapshot
from modelkv_exporter.contract.validity import (
    boolean_problem,
    declaration_problems,
    integer_problem,
    integer_range,
    number_problem,
    text_problem,
)


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


Reader = Callable[[Any, str, int], Any]
"""Reads one JSON value found at a path, for a document of a schema version, into its Python value."""


def _scalar(
    problem_of: Callable[[Any, Rule], str | None], convert: Callable[[Any], Any]
) -> Callable[[FieldInfo], Reader]:
    """The reader of a scalar kind: ``problem_of`` judges a value by the field's rule, ``convert`` makes it Python's."""

    def reader(info: FieldInfo) -> Reader:
        rule = info.rule

        def read(value: Any, where: str, version: int) -> Any:
            problem = problem_of(value, rule)
            if problem is not None:
                _invalid(where, problem)
            return convert(value)

        return read

    return reader


_integer = _scalar(integer_problem, int)
_number = _scalar(number_problem, float)
_boolean = _scalar(boolean_problem, bool)


def _text(info: FieldInfo) -> Reader:
    rule = info.rule

    def read(value: Any, where: str, version: int) -> str:
        if value.__class__ is str and not value.isascii():
            value = value.encode("utf-8", "replace").decode("utf-8")
        problem = text_problem(value, rule)
        if problem is not None:
            _invalid(where, problem)
        return str(value)

    return read


def _counts(info: FieldInfo) -> Reader:
    pattern = re.compile(info.rule.pattern or ".*")
    count = _integer(info)

    def read(value: Any, where: str, version: int) -> dict[str, int]:
        if not isinstance(value, dict):
            _invalid(where, f"expected an object, got {type(value).__name__}")
        parsed: dict[str, int] = {}
        for key, item in value.items():
            if not pattern.fullmatch(key):
                _invalid(where, f"measurement source {key[:80]!r} is not a plain name")
            parsed[key] = count(item, f"{where}.{key}", version)
        return parsed

    return read


def _listing(info: FieldInfo) -> Reader:
    assert info.nested is not None
    item = _object_reader(info.nested)
    longest = info.rule.max_length

    def read(value: Any, where: str, version: int) -> tuple[Any, ...]:
        if not isinstance(value, list):
            _invalid(where, f"expected a list, got {type(value).__name__}")
        if longest is not None and len(value) > longest:
            _invalid(where, f"{len(value)} entries, at most {longest}")
        return tuple(item(entry, f"{where}[{i}]", version) for i, entry in enumerate(value))

    return read


def _field_reader(info: FieldInfo) -> Reader:
    if info.kind == "object":
        assert info.nested is not None
        return _object_reader(info.nested)
    build = {
        "integer": _integer,
        "number": _number,
        "text": _text,
        "boolean": _boolean,
        "counts": _counts,
        "list": _listing,
    }[info.kind]
    return build(info)


INTEGER, PLAIN_TEXT = 1, 2
"""Fields a valid document's value passes without a call: an in-range integer, an ASCII text with no bound."""


def _fast_path(info: FieldInfo) -> tuple[int, int, int]:
    """Which fast path a field takes (0: none), and an integer's lowest and highest value.

    Any other value (a bool, a non-ASCII string with possible lone surrogates, a bounded text)
    goes through the field's full reader, which gives the error.
    """
    rule = info.rule
    if info.kind == "integer":
        return (INTEGER, *integer_range(info.rule))
    plain = rule.min_length == 0 and rule.max_length is None and rule.pattern is None and rule.choices is None
    return (PLAIN_TEXT if info.kind == "text" and plain else 0), 0, 0


@functools.cache
def _object_reader(cls: type) -> Reader:
    """The reader of one snapshot dataclass, compiled once from its field declarations.

    A field that is missing or null takes its declared ``absent`` value, or makes the document
    invalid when it has none (or, with ``required_below``, in older versions). A boolean is
    absent only when missing: JSON's null is no truth value.
    """
    plan = [
        (
            info.name,
            info.rule.absent,
            info.rule.required_below,
            info.kind == "boolean",
            _field_reader(info),
            *_fast_path(info),
        )
        for info in fields_of(cls)
    ]

    def read(value: Any, where: str, version: int) -> Any:
        if not isinstance(value, dict):
            _invalid(where, f"expected an object, got {type(value).__name__}")
        arguments: dict[str, Any] = {}
        get = value.get
        for name, absent, required_below, boolean, field_reader, fast, lowest, highest in plan:
            item = get(name)
            if fast == INTEGER and item.__class__ is int and lowest <= item <= highest:
                arguments[name] = item
            elif fast == PLAIN_TEXT and item.__class__ is str and item.isascii():
                arguments[name] = item
            elif item is None and (not boolean or name not in value):
                if absent is REQUIRED or (required_below is not None and version < required_below):
                    _invalid(f"{where}.{name}", "required field is missing")
                arguments[name] = absent
            else:
                arguments[name] = field_reader(item, f"{where}.{name}", version)
        return cls(**arguments)

    return read


OBSERVED_FIGURES = ("peak_bytes", "recent_peak_bytes", "live_bytes", "cache_calls", "plain_bytes")
"""An observation's figures that mean nothing when it is not ``available``."""


def _checked(snapshot: Snapshot) -> Snapshot:
    """The checks no field declaration says; an unavailable observation's figures dropped."""
    seen: set[tuple[str, str]] = set()
    for i, declaration in enumerate(snapshot.declarations):
        where = f"snapshot.declarations[{i}]"
        for field, problem in declaration_problems(declaration, snapshot.settings.max_num_seqs):
            _invalid(f"{where}.{field}", problem)
        key = (declaration.owner, declaration.name)
        if key in seen:
            _invalid(where, f"duplicate declaration {declaration.name!r} of owner {declaration.owner!r}")
        seen.add(key)
    if snapshot.started_at > snapshot.heartbeat_at:
        _invalid("snapshot.started_at", f"{snapshot.started_at!r} is after heartbeat_at {snapshot.heartbeat_at!r}")
    if snapshot.end is not None and not snapshot.ended:
        _invalid("snapshot.end", "present while `ended` is false")
    owners = [o.owner for o in snapshot.observations]
    if len(set(owners)) != len(owners):
        _invalid("snapshot.observations", "an owner is observed twice")
    if any(not o.available for o in snapshot.observations):
        observations = tuple(
            o if o.available else o.__class__(**{**vars(o), **dict.fromkeys(OBSERVED_FIGURES)})
            for o in snapshot.observations
        )
        snapshot = Snapshot(**{**vars(snapshot), "observations": observations})
    return snapshot


def decode_json(data: bytes) -> Any:
    """Strict JSON: UTF-8 only, no NaN or Infinity, bounded nesting and integer size."""
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:
        raise SnapshotError(RejectReason.INVALID_JSON, "nesting too deep") from None
    except ValueError as error:
        raise SnapshotError(RejectReason.INVALID_JSON, str(error)[:200]) from None


def schema_version_of(document: Any) -> int:
    """The document's ``schema_version``, refused when invalid or newer than this reader reads."""
    if not isinstance(document, dict):
        _invalid("snapshot", f"expected an object, got {type(document).__name__}")
    version = document.get(VERSION_FIELD.name)
    if version is None:
        _invalid(f"snapshot.{VERSION_FIELD.name}", "required field is missing")
    if version.__class__ is int and version > SCHEMA_VERSION:
        raise SnapshotError(
            RejectReason.UNSUPPORTED_VERSION,
            f"schema_version {version} is newer than this sidecar reads ({SCHEMA_VERSION}); upgrade the sidecar",
        )
    read: int = _integer(VERSION_FIELD)(version, f"snapshot.{VERSION_FIELD.name}", 0)
    return read


def snapshot_from_dict(document: Any) -> Snapshot:
    """Validate a decoded JSON document and build the ``Snapshot`` it describes."""
    version = schema_version_of(document)
    snapshot: Snapshot = _object_reader(Snapshot)(document, "snapshot", version)
    return _checked(snapshot)


def parse_snapshot(data: bytes) -> Snapshot:
    """Parse snapshot file bytes; raises ``SnapshotError`` and nothing else on bad input."""
    return snapshot_from_dict(decode_json(data))
