"""How a snapshot field is written down once: its type, its bounds and its meaning.

Every field of the snapshot dataclasses is declared with ``snapshot_field(...)``: the Python type says
what kind of JSON value it is, the ``Rule`` says its bounds, what a reader takes when it is
absent, and what it means. The encoder (``Snapshot.to_dict``), the reader's decoder, the JSON
Schema (``docs/snapshot.schema.json``) and the field reference in ``docs/snapshot-format.md``
are all derived from these declarations (``fields_of``); a test fails when a generated file
drifts. Standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

MAX_INT = 2**63 - 1
"""The largest integer a snapshot holds (a signed 64-bit count of bytes)."""

MAX_NUMBER = 1e15
"""The largest number a snapshot holds (a Unix time in seconds, an interval)."""

PLAIN_NAME = r"[a-z][a-z0-9_]{0,63}"
"""A measurement source or a drop reason: lower case, digits and underscores, at most 64 characters."""


class _Required:
    """The type of ``REQUIRED``."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""``Rule.absent`` (and ``snapshot_field``'s ``default``) of a field a document must carry, not null, not missing."""


@dataclass(frozen=True)
class Rule:
    """The bounds and meaning of one snapshot field, beyond its Python type.

    ``absent`` is what a reader takes for a missing or null field (``REQUIRED``: the document
    is invalid without it); ``required_below`` makes a field required in documents of a lower
    ``schema_version`` only. ``minimum``/``maximum`` bound integers and numbers; ``min_length``,
    ``max_length``, ``pattern`` and ``choices`` bound strings (``max_length`` a list's entries too; ``pattern`` bounds
    a mapping's keys).
    """

    meaning: str
    absent: Any = REQUIRED
    required_below: int | None = None
    minimum: float = 0
    maximum: float | None = None
    min_length: int = 0
    max_length: int | None = None
    pattern: str | None = None
    choices: frozenset[str] | None = None


def snapshot_field(meaning: str, *, default: Any = REQUIRED, **bounds: Any) -> Any:
    """A dataclass field with its ``Rule``; ``default`` is the Python default, ``absent`` (in ``bounds``) the reader's.

    A field with a Python default is read as that default when absent, unless ``absent`` says otherwise.
    """
    if "absent" not in bounds and default is not REQUIRED:
        bounds["absent"] = default
    rule = Rule(meaning, **bounds)
    if default is REQUIRED:
        return dataclasses.field(metadata={"rule": rule})
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"rule": rule})
    return dataclasses.field(default=default, metadata={"rule": rule})


@dataclass(frozen=True)
class FieldInfo:
    """One field as the derived code sees it: its name, JSON kind, nullability, nested class and rule.

    ``kind`` is one of ``integer``, ``number``, ``text``, ``boolean``, ``object`` (a nested
    dataclass, ``nested``), ``list`` (of ``nested`` objects) or ``counts`` (a mapping of
    plain names to integers).
    """

    name: str
    kind: str
    nullable: bool
    rule: Rule
    nested: type | None = None

    @property
    def required(self) -> bool:
        """Whether every document must carry this field."""
        return self.rule.absent is REQUIRED and self.rule.required_below is None


def _kind(annotation: Any) -> tuple[str, bool, type | None]:
    """The JSON kind of a Python annotation, whether it admits None, and its nested dataclass."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        kind, _, nested = _kind(members[0])
        return kind, True, nested
    if origin is tuple:
        return "list", False, typing.get_args(annotation)[0]
    if origin in (Mapping, dict) or annotation in (Mapping, dict):
        return "counts", False, None
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return "object", False, annotation
    return {bool: "boolean", int: "integer", float: "number", str: "text"}[annotation], False, None


@functools.cache
def fields_of(cls: type) -> tuple[FieldInfo, ...]:
    """The fields of a snapshot dataclass, in their declared (and written) order."""
    hints = typing.get_type_hints(cls)
    found = []
    for field in dataclasses.fields(cls):
        rule = field.metadata.get("rule")
        if rule is None:
            raise TypeError(f"{cls.__name__}.{field.name} is declared without snapshot_field()")
        kind, nullable, nested = _kind(hints[field.name])
        found.append(FieldInfo(field.name, kind, nullable, rule, nested))
    return tuple(found)
