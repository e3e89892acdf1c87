"""Resolve declared specs (ours or any object with the same fields) into snapshot records."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from enum import Enum
from typing import Any

import torch

from modelkv_exporter.contract import arithmetic
from modelkv_exporter.contract.snapshot import Declaration, DroppedDeclaration
from modelkv_exporter.contract.validity import declaration_problems, record_problems
from modelkv_exporter.contract.vocabulary import DropReason, RowDriver
from modelkv_exporter.engine.engine_log import get_logger
from modelkv_exporter.engine.protocol import DeclarerFailure, OwnedSpec, element_size, error_text

logger = get_logger("resolve")


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


class InvalidDeclaration(ValueError):
    """A spec with a field the snapshot cannot carry (``contract/validity.py``): dropped, never published."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid field {field}: {problem}")
        self.field = field


def _plain(value: Any) -> Any:
    """An enum member's value (ours, vLLM-Omni's or any other), anything else as it is."""
    member = getattr(value, "value", value)
    return member if isinstance(value, Enum) else value


def declaration_from_spec(owner_path: str, owner_class: str, spec: Any, max_num_seqs: int | None) -> Declaration:
    """One spec, duck-typed, resolved at the engine's ``max_num_seqs``.

    Every field is checked by the rules the sidecar's reader applies (``contract/validity.py``), before
    any arithmetic: a value of the wrong type (``layers='6'``, ``kv_heads=2.5``, ``scope=...``) or out of
    bounds (``scope="forever"``, negative positions) raises ``InvalidDeclaration`` naming the field, and is
    never coerced; a ``dtype`` that is not a ``torch.dtype`` (``"float32"``) is refused the same way. Without
    ``max_num_seqs`` (an engine that has none) a per-sequence spec has no peak: it raises rather than being
    published at a made-up row count.
    """
    if type(spec.dtype) is not torch.dtype:
        raise InvalidDeclaration(
            "dtype", f"must be a torch.dtype (torch.float32), got {type(spec.dtype).__name__} {spec.dtype!r}"
        )
    values: dict[str, Any] = {
        "owner": owner_path,
        "owner_class": owner_class,
        "name": spec.name,
        "layers": spec.layers,
        "kv_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "dtype": dtype_name(spec.dtype),
        "element_size": element_size(spec.dtype),
        "physical_capacity_positions": spec.physical_capacity_positions,
        "capacity_source": spec.capacity_source,
        "scope": _plain(spec.scope),
        "rows": _plain(spec.rows),
        "rows_fixed": spec.rows_fixed,
        "rows_reason": "" if spec.rows_reason is None else spec.rows_reason,
        "allocation_note": spec.allocation_note,
    }
    for field, problem in record_problems(Declaration, values):
        raise InvalidDeclaration(field, problem)
    driver = values["rows"]
    if max_num_seqs is None and driver != RowDriver.FIXED.value:
        raise ValueError(f"{spec.name!r} has rows per sequence, but this engine has no max_num_seqs")
    per_row = arithmetic.bytes_per_row(
        layers=values["layers"],
        kv_heads=values["kv_heads"],
        head_dim=values["head_dim"],
        positions=values["physical_capacity_positions"],
        element_size=values["element_size"],
    )
    rows = arithmetic.row_count(driver, values["rows_fixed"], max_num_seqs or 1)
    integers = ("layers", "kv_heads", "head_dim", "element_size", "physical_capacity_positions", "rows_fixed")
    values.update({name: int(values[name]) for name in integers})
    declaration = Declaration(**values, bytes_per_row=per_row, row_count=rows, peak_bytes=per_row * rows)
    for field, problem in record_problems(Declaration, vars(declaration)) + declaration_problems(
        declaration, max_num_seqs
    ):
        raise InvalidDeclaration(field, problem)
    return declaration


def resolve_owned(
    owned: Iterable[OwnedSpec], max_num_seqs: int | None
) -> tuple[tuple[Declaration, ...], tuple[DroppedDeclaration, ...]]:
    """Resolve every owned spec, and count per owner those that cannot be resolved (logged and skipped).

    Two specs with the same owner and name (a declarer bug) keep both, the second
    renamed ``name#2``, so no bytes disappear and no exported series collides.
    """
    resolved: list[Declaration] = []
    unresolved: dict[tuple[str, str], list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for item in owned:
        try:
            declaration = declaration_from_spec(item.owner_path, item.owner_class, item.spec, max_num_seqs)
        except InvalidDeclaration as error:
            logger.warning(
                "modelkv: dropping a declaration of %s (%r): %s; the rest is published",
                item.owner_class,
                item.owner_path,
                error,
            )
            unresolved.setdefault((item.owner_path, item.owner_class), []).append(error_text(error))
            continue
        except Exception as error:
            logger.warning("cannot resolve a spec of %s; skipping it", item.owner_class, exc_info=True)
            unresolved.setdefault((item.owner_path, item.owner_class), []).append(error_text(error))
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
        DroppedDeclaration(path, owner_class, DropReason.UNRESOLVABLE_SPEC.value, len(errors), errors[0])
        for (path, owner_class), errors in unresolved.items()
    )
    return tuple(resolved), dropped


def declarer_failures(failures: Iterable[DeclarerFailure]) -> tuple[DroppedDeclaration, ...]:
    """Each failed declarer as a dropped declaration (count 1: how many specs it would have made is unknown)."""
    return tuple(
        DroppedDeclaration(f.owner_path, f.owner_class, DropReason.DECLARER_RAISED.value, 1, f.error) for f in failures
    )
