"""What makes a field value, and a declaration, valid: one definition for the engine and the sidecar's reader.

The engine applies it to each declaration it collects (an invalid one is dropped with the reason,
the rest of the snapshot published); the sidecar's reader applies it to every document it reads
(``sidecar/reader/decode.py``). Each problem is a short text naming what is wrong with the value.
The bounds themselves are the fields' ``Rule``s (``contract/fields.py``). Standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from modelkv_exporter.contract import arithmetic
from modelkv_exporter.contract.fields import MAX_INT, MAX_NUMBER, FieldInfo, Rule, fields_of
from modelkv_exporter.contract.vocabulary import RowDriver

Problem = tuple[str, str]
"""``(field, what is wrong with it)``."""


def integer_range(rule: Rule) -> tuple[int, int]:
    """The lowest and highest value an integer field admits."""
    return int(rule.minimum), MAX_INT if rule.maximum is None else int(rule.maximum)


def integer_problem(value: Any, rule: Rule) -> str | None:
    """An integer (not a bool, not a float, not a string) within the rule's range."""
    if value.__class__ is not int and (isinstance(value, bool) or not isinstance(value, int)):
        return f"expected an integer, got {type(value).__name__}"
    minimum, maximum = integer_range(rule)
    if not minimum <= value <= maximum:
        shown = "2^63-1" if maximum == MAX_INT else str(maximum)
        return f"{value} is outside [{minimum}, {shown}]"
    return None


def number_problem(value: Any, rule: Rule) -> str | None:
    """A finite number in ``[0, MAX_NUMBER]`` and below the rule's maximum."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a number, got {type(value).__name__}"
    if not math.isfinite(value) or value < 0 or value > MAX_NUMBER:
        return f"{value!r} is not a finite number in [0, 1e15]"
    if rule.maximum is not None and value > rule.maximum:
        return f"{value} is above {rule.maximum:g}"
    return None


@cache
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


def text_problem(value: Any, rule: Rule) -> str | None:
    """A string within the rule's length, one of its choices, matching its pattern."""
    if value.__class__ is not str:
        return f"expected a string, got {type(value).__name__}"
    if len(value) < rule.min_length or (rule.max_length is not None and len(value) > rule.max_length):
        if rule.max_length is None:
            return f"must have at least {rule.min_length} character(s)"
        return f"must be {rule.min_length} to {rule.max_length} characters"
    if rule.choices is not None and value not in rule.choices:
        return f"{value!r} is not one of {sorted(rule.choices)}"
    if rule.pattern is not None and not _pattern(rule.pattern).fullmatch(value):
        return f"{value[:80]!r} is not a plain name"
    return None


def boolean_problem(value: Any, rule: Rule) -> str | None:
    """``True`` or ``False``."""
    return None if isinstance(value, bool) else f"expected true or false, got {type(value).__name__}"


PLAIN_KINDS = {"integer": integer_problem, "number": number_problem, "text": text_problem, "boolean": boolean_problem}
"""The check of each plain field kind."""


def field_problem(info: FieldInfo, value: Any) -> str | None:
    """What is wrong with ``value`` for a plain field (None: valid). None/absent is the caller's to judge."""
    check = PLAIN_KINDS.get(info.kind)
    return None if check is None else check(value, info.rule)


def record_problems(cls: type, values: Mapping[str, Any]) -> list[Problem]:
    """Every plain field of snapshot dataclass ``cls`` given in ``values`` whose value is invalid (None for a
    required one included)."""
    problems = []
    for info in fields_of(cls):
        if info.kind not in PLAIN_KINDS or info.name not in values:
            continue
        value = values.get(info.name)
        if value is None:
            if not info.nullable and info.required:
                problems.append((info.name, "required field is missing"))
            continue
        problem = field_problem(info, value)
        if problem is not None:
            problems.append((info.name, problem))
    return problems


def declaration_problems(declaration: Any, max_num_seqs: int | None) -> list[Problem]:
    """What a valid declaration's figures must add up to beyond each field's own rule: its driver resolvable
    at ``max_num_seqs``, and ``bytes_per_row``, ``row_count``, ``peak_bytes`` its arithmetic."""
    if max_num_seqs is None and declaration.rows != RowDriver.FIXED.value:
        return [("rows", f"{declaration.rows!r} needs settings.max_num_seqs, which is absent")]
    expected_row = arithmetic.bytes_per_row(
        layers=declaration.layers,
        kv_heads=declaration.kv_heads,
        head_dim=declaration.head_dim,
        positions=declaration.physical_capacity_positions,
        element_size=declaration.element_size,
    )
    expected_rows = arithmetic.row_count(declaration.rows, declaration.rows_fixed, max_num_seqs or 1)
    if declaration.bytes_per_row != expected_row:
        return [("bytes_per_row", f"{declaration.bytes_per_row} != geometry's {expected_row}")]
    if declaration.row_count != expected_rows:
        return [("row_count", f"{declaration.row_count} != driver's {expected_rows}")]
    if declaration.peak_bytes != expected_row * expected_rows:
        return [("peak_bytes", f"{declaration.peak_bytes} != {expected_row} x {expected_rows}")]
    return []
