"""Resolve declared specs (ours or any object with the same fields) into snapshot records."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from modelkv_exporter.contract import arithmetic
from modelkv_exporter.contract.snapshot import Declaration, DroppedDeclaration
from modelkv_exporter.contract.vocabulary import DropReason, RowDriver
from modelkv_exporter.engine.log import get_logger
from modelkv_exporter.engine.protocol import DeclarerFailure, OwnedSpec, driver_value, element_size, error_text

logger = get_logger("resolve")


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


def declaration_from_spec(owner_path: str, owner_class: str, spec: Any, max_num_seqs: int | None) -> Declaration:
    """One spec, duck-typed, resolved at the engine's ``max_num_seqs``.

    Without ``max_num_seqs`` (an engine that has none) a per-sequence spec has no peak: it
    raises rather than being published at a made-up row count.
    """
    driver = driver_value(spec.rows)
    if max_num_seqs is None and driver != RowDriver.FIXED.value:
        raise ValueError(f"{spec.name!r} has rows per sequence, but this engine has no max_num_seqs")
    size = element_size(spec.dtype)
    per_row = arithmetic.bytes_per_row(
        layers=int(spec.layers),
        kv_heads=int(spec.kv_heads),
        head_dim=int(spec.head_dim),
        positions=int(spec.physical_capacity_positions),
        element_size=size,
    )
    rows = arithmetic.row_count(driver, int(spec.rows_fixed), max_num_seqs or 1)
    return Declaration(
        owner=owner_path,
        owner_class=owner_class,
        name=str(spec.name),
        layers=int(spec.layers),
        kv_heads=int(spec.kv_heads),
        head_dim=int(spec.head_dim),
        dtype=dtype_name(spec.dtype),
        element_size=size,
        physical_capacity_positions=int(spec.physical_capacity_positions),
        capacity_source=str(spec.capacity_source),
        scope=str(getattr(spec.scope, "value", spec.scope)),
        rows=driver,
        rows_fixed=int(spec.rows_fixed),
        rows_reason=str(spec.rows_reason or ""),
        allocation_note=None if spec.allocation_note is None else str(spec.allocation_note),
        bytes_per_row=per_row,
        row_count=rows,
        peak_bytes=per_row * rows,
    )


def resolve_declarations(owned: Iterable[OwnedSpec], max_num_seqs: int | None) -> tuple[Declaration, ...]:
    """Resolve every owned spec; a spec that cannot be resolved is logged and skipped."""
    return resolve_owned(owned, max_num_seqs)[0]


def resolve_owned(
    owned: Iterable[OwnedSpec], max_num_seqs: int | None
) -> tuple[tuple[Declaration, ...], tuple[DroppedDeclaration, ...]]:
    """Resolve every owned spec, and count per owner those that cannot be resolved (logged and skipped).

    Two specs with the same owner and name (a declarer bug) keep both, the second
    renamed ``name#2``, so no bytes disappear and no exported series collides.
    """
    resolved: list[Declaration] = []
    unresolved: dict[tuple[str, str], tuple[int, str]] = {}
    seen: set[tuple[str, str]] = set()
    for item in owned:
        try:
            declaration = declaration_from_spec(item.owner_path, item.owner_class, item.spec, max_num_seqs)
        except Exception as error:
            logger.warning("cannot resolve a spec of %s; skipping it", item.owner_class, exc_info=True)
            count, first = unresolved.get((item.owner_path, item.owner_class), (0, error_text(error)))
            unresolved[(item.owner_path, item.owner_class)] = (count + 1, first)
            continue
        name, n = declaration.name, 1
        while (declaration.owner, name) in seen:
            n += 1
            name = f"{declaration.name}#{n}"
        if n > 1:
            logger.warning(
                "%s declares %r more than once; exporting it as %r", item.owner_class, declaration.name, name
            )
            declaration = replace(declaration, name=name)
        seen.add((declaration.owner, name))
        resolved.append(declaration)
    dropped = tuple(
        DroppedDeclaration(path, owner_class, DropReason.UNRESOLVABLE_SPEC.value, count, error)
        for (path, owner_class), (count, error) in unresolved.items()
    )
    return tuple(resolved), dropped


def declarer_failures(failures: Iterable[DeclarerFailure]) -> tuple[DroppedDeclaration, ...]:
    """Each failed declarer as a dropped declaration (count 1: how many specs it would have made is unknown)."""
    return tuple(
        DroppedDeclaration(f.owner_path, f.owner_class, DropReason.DECLARER_RAISED.value, 1, f.error) for f in failures
    )
