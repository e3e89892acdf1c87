"""A suggested declaration as code a model author can paste: ``ModelLocalKVSpec(...)``, each figure with its note.

Both the model author's check (``modelkv_exporter.testing``) and ``modelkv-exporter check`` (a
spool) write suggestions; this is the one way they are written. A figure that could not be
inferred is a comment with the reason, never guessed and never a placeholder value: pasted as it
is, the spec is missing that argument and fails where it is built (a placeholder such as ``...``
would build, and an engine would drop the declaration), so the author's own file says what is
still theirs to decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from modelkv_exporter.contract.snapshot import Declaration, KVLayout
from modelkv_exporter.contract.vocabulary import RowDriver

NOT_INFERRED = "# {field}: not inferred: {evidence}"
"""How a figure that could not be inferred is written: a comment line in place of its argument."""

IMPORTS = (
    "import torch\n"
    "from modelkv_exporter.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver\n"
    "# (or the same names from vllm_omni.model_executor.models.model_local_kv)"
)
"""The import lines the suggested code needs."""


@dataclass(frozen=True)
class Figure:
    """One keyword argument of the suggested spec.

    ``code`` is the Python expression of its value (None: not inferred); ``evidence`` says
    where the figure comes from, or why it could not be inferred.
    """

    field: str
    code: str | None
    evidence: str

    @property
    def inferred(self) -> bool:
        """Whether the figure was inferred from what was observed."""
        return self.code is not None


def spec_code(figures: Sequence[Figure], indent: str = "") -> str:
    """``ModelLocalKVSpec(`` one line per figure, a comment with the reason for each that is not inferred ``)``."""
    lines = [f"{indent}ModelLocalKVSpec("]
    for figure in figures:
        if figure.code is None:
            lines.append(f"{indent}    " + NOT_INFERRED.format(field=figure.field, evidence=figure.evidence))
        else:
            lines.append(f"{indent}    {figure.field}={figure.code},")
    lines.append(f"{indent})")
    return "\n".join(lines)


def evidence_lines(figures: Sequence[Figure], indent: str = "") -> list[str]:
    """``field: evidence`` for every figure, the not-inferred ones marked."""
    return [
        f"{indent}{figure.field}: {figure.evidence}"
        if figure.inferred
        else f"{indent}{figure.field}: NOT INFERRED: {figure.evidence}"
        for figure in figures
    ]


def python_string(text: str) -> str:
    """``text`` as a Python string literal (double-quoted where it can be)."""
    literal = repr(text)
    if literal.startswith("'") and '"' not in text:
        literal = '"' + literal[1:-1].replace("\\'", "'") + '"'
    return literal


def dtype_code(dtype: str) -> str:
    """``bfloat16`` -> ``torch.bfloat16``."""
    return f"torch.{dtype}"


def spec_name(owner: str) -> str:
    """A spec name from the owner's path: ``tokenizer.decoder`` -> ``decoder_kv``."""
    last = (owner or "root").rsplit(".", 1)[-1]
    return "".join(c if c.isalnum() else "_" for c in last) + "_kv"


def positions_for(peak_bytes: int, geometry: KVLayout | Declaration, rows: int) -> int:
    """Positions a row that hold ``peak_bytes`` at ``geometry``'s layers, heads and element size and ``rows`` rows
    (rounded up)."""
    per_position = 2 * geometry.layers * geometry.kv_heads * geometry.head_dim * geometry.element_size * max(1, rows)
    return -(-peak_bytes // per_position)


SCOPE_UNKNOWN = "how long one allocation lives is the design's: INVOCATION, REQUEST, SESSION or MODEL"
CAPACITY_SOURCE_UNKNOWN = "where the bound comes from (a config field, a formula)"


def layout_figures(owner: str, peak_bytes: int, layout: KVLayout) -> tuple[Figure, ...]:
    """A declaration from a geometry an engine saw (a discovered owner's ``layout``) and its peak."""
    positions = positions_for(peak_bytes, layout, layout.rows)
    seen = f"keys [rows, {layout.kv_heads}, positions, {layout.head_dim}]"
    return (
        Figure("name", python_string(spec_name(owner)), "a name unique within the owner"),
        Figure("layers", str(layout.layers), f"{layout.layers} cache layers seen"),
        Figure("kv_heads", str(layout.kv_heads), seen),
        Figure("head_dim", str(layout.head_dim), seen),
        Figure("dtype", dtype_code(layout.dtype), f"the cache tensors' dtype ({layout.element_size} bytes an element)"),
        Figure(
            "physical_capacity_positions",
            None,
            f"at least {positions} a row: the peak ({peak_bytes:,} B) at {layout.rows} rows (one row held at most "
            f"{layout.positions}); a running engine does not show whether that is its bound",
        ),
        Figure("capacity_source", None, CAPACITY_SOURCE_UNKNOWN),
        Figure("scope", None, SCOPE_UNKNOWN),
        Figure(
            "rows",
            None,
            f"at most {layout.rows} rows were held at once; one engine's run cannot tell one row per sequence from a "
            "fixed count",
        ),
    )


def resized_figures(owner: str, observed_bytes: int, declarations: Sequence[Declaration]) -> tuple[Figure, ...] | None:
    """The owner's declarations as one spec of the same geometry and rows, sized to what its caches held.

    For a running engine, which reports bytes but no geometry for declared caches; None when the
    declarations differ in geometry or row driver (then no single spec can be written from bytes).
    """
    shapes = {(d.layers, d.kv_heads, d.head_dim, d.dtype, d.element_size, d.rows, d.rows_fixed) for d in declarations}
    if len(shapes) != 1:
        return None
    first = declarations[0]
    positions = positions_for(observed_bytes, first, first.row_count)
    declared = " + ".join(str(d.physical_capacity_positions) for d in declarations)
    geometry = "as declared: a running engine reports bytes, not the geometry, of declared caches"
    rows = (
        (Figure("rows", "RowDriver.MAX_NUM_SEQS", geometry),)
        if first.rows == RowDriver.MAX_NUM_SEQS.value
        else (
            Figure("rows", "RowDriver.FIXED", geometry),
            Figure("rows_fixed", str(first.rows_fixed), geometry),
            Figure("rows_reason", python_string(first.rows_reason), geometry),
        )
    )
    return (
        Figure("name", python_string(spec_name(owner)), f"one spec for {', '.join(d.name for d in declarations)}"),
        Figure("layers", str(first.layers), geometry),
        Figure("kv_heads", str(first.kv_heads), geometry),
        Figure("head_dim", str(first.head_dim), geometry),
        Figure("dtype", dtype_code(first.dtype), geometry),
        Figure(
            "physical_capacity_positions",
            str(positions),
            f"at least this many a row: the observed peak ({observed_bytes:,} B) at {first.row_count} rows, where "
            f"the declarations add up to {declared}; check the geometry with modelkv_exporter.testing",
        ),
        Figure("capacity_source", None, CAPACITY_SOURCE_UNKNOWN),
        Figure("scope", None, SCOPE_UNKNOWN),
        *rows,
    )
