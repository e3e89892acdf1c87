"""Which field of a declaration disagrees with the caches the run saw, and how.

Compared with the layers held at the owner's peak: the dtype, kv heads and head dim its layers
have, the layer count they share, the row driver the batches showed, and last (only when all of
those agree) the positions a row. A dtype of the same width, or heads and head dim swapped, hold
the same bytes: only these comparisons catch them. The layers are those of one cache (separate cache
objects live at once are rows, not layers); a geometry's declarations hold its layers when one of them
declares that many or they add up to it (one spec per group of layers).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from modelkv_exporter.contract.snapshot import Declaration
from modelkv_exporter.contract.vocabulary import RowDriver
from modelkv_exporter.testing.infer import Rows
from modelkv_exporter.testing.peak_layout import Shape


@dataclass(frozen=True)
class FieldProblem:
    """One declared field that disagrees with what the run saw."""

    field: str
    text: str


def _names(declarations: Sequence[Declaration]) -> str:
    return ", ".join(d.name for d in declarations)


def _values(values: Collection[object]) -> str:
    return ", ".join(str(v) for v in sorted(values, key=str))


def geometry_problems(declarations: Sequence[Declaration], shapes: Sequence[Shape]) -> list[FieldProblem]:
    """dtype, kv_heads and head_dim: a value the caches held that no declaration has, or one declared that no
    cache held; when those agree, the layers of one cache against the declarations of its geometry."""
    problems = []
    compared: tuple[tuple[str, Collection[object], Collection[object]], ...] = (
        ("dtype", {s.dtype for s in shapes}, {d.dtype for d in declarations}),
        ("kv_heads", {s.kv_heads for s in shapes}, {d.kv_heads for d in declarations}),
        ("head_dim", {s.head_dim for s in shapes}, {d.head_dim for d in declarations}),
    )
    for field, seen, declared in compared:
        wrong = {value for value in seen if value not in declared} | {value for value in declared if value not in seen}
        if wrong:
            names = _names([d for d in declarations if getattr(d, field) in wrong] or declarations)
            problems.append(
                FieldProblem(field, f"{field}: {names} declares {_values(declared)}; its caches hold {_values(seen)}")
            )
    if problems:
        return problems
    for shape in shapes:
        same = [
            d
            for d in declarations
            if (d.kv_heads, d.head_dim, d.dtype) == (shape.kv_heads, shape.head_dim, shape.dtype)
        ]
        declared_layers = [d.layers for d in same or declarations]
        if all(layers == shape.layers for layers in declared_layers) or sum(declared_layers) == shape.layers:
            continue
        problems.append(
            FieldProblem(
                "layers",
                f"layers: {_names(same or declarations)} declares {_values(set(declared_layers))}; its caches have "
                f"{shape.layers} layers each ({shape.groups_text} at the peak)",
            )
        )
    return problems


def row_problems(declarations: Sequence[Declaration], rows: Rows, peak_rows: int) -> list[FieldProblem]:
    """The row driver and count against what the batches showed (or, without it, the rows held)."""
    problems = []
    for declaration in declarations:
        fixed = declaration.rows == RowDriver.FIXED.value
        if rows.driver is RowDriver.MAX_NUM_SEQS and fixed:
            problems.append(
                FieldProblem(
                    "rows",
                    f"rows: {declaration.name} declares FIXED ({declaration.rows_fixed} rows); its caches held one "
                    f"row per sequence ({rows.evidence}): declare RowDriver.MAX_NUM_SEQS",
                )
            )
        elif rows.driver is RowDriver.FIXED and not fixed:
            problems.append(
                FieldProblem(
                    "rows",
                    f"rows: {declaration.name} declares one row per sequence (MAX_NUM_SEQS); its caches held "
                    f"{rows.evidence}: declare RowDriver.FIXED",
                )
            )
        elif fixed and peak_rows > declaration.rows_fixed:
            problems.append(
                FieldProblem(
                    "rows_fixed",
                    f"rows_fixed: {declaration.name} declares {declaration.rows_fixed} rows; its caches held "
                    f"{peak_rows}",
                )
            )
    return problems


def position_problems(declarations: Sequence[Declaration], shape: Shape) -> list[FieldProblem]:
    """Positions a row: the declarations of this geometry added up, at the layer count the caches share."""
    same = [
        d
        for d in declarations
        if (d.kv_heads, d.head_dim, d.dtype, d.element_size)
        == (shape.kv_heads, shape.head_dim, shape.dtype, shape.element_size)
    ]
    if not same or shape.layers == 0:
        return []
    declared = sum(d.layers * d.physical_capacity_positions for d in same) / shape.layers
    if shape.positions <= declared:
        return []
    parts = " + ".join(f"{d.physical_capacity_positions} ({d.name})" for d in same)
    return [
        FieldProblem(
            "physical_capacity_positions",
            f"physical_capacity_positions: declares {declared:g} positions a row over {shape.layers} layers "
            f"({parts}); its caches held {shape.positions} a row at the peak ({shape.groups_text})",
        )
    ]


def diagnose(
    declarations: Sequence[Declaration], shapes: Sequence[Shape], rows: Rows, peak_rows: int
) -> list[FieldProblem]:
    """Every field problem, geometry first; positions only when geometry and rows agree."""
    if not declarations or not shapes:
        return []
    problems = geometry_problems(declarations, shapes) + row_problems(declarations, rows, peak_rows)
    if problems:
        return problems
    return [problem for shape in shapes for problem in position_problems(declarations, shape)]
