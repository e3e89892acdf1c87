"""What the call peaks say about a declaration: the row driver, whether a bound was reached, the suggestion.

Every inference keeps its evidence (calls, batch sizes, positions) and gives up, saying why,
where the run does not show it: a row count seen at one batch size cannot tell "one row per
sequence" from a fixed count, and positions seen in one call cannot tell a bound from an input's
length. The scope is never inferred: how long an allocation lives is the author's design.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from modelkv_exporter.contract.snapshot import Declaration
from modelkv_exporter.contract.vocabulary import RowDriver
from modelkv_exporter.judging.declaration_text import (
    CAPACITY_SOURCE_UNKNOWN,
    SCOPE_UNKNOWN,
    Figure,
    dtype_code,
    python_string,
    spec_name,
)
from modelkv_exporter.testing.peak_layout import CallPeak, Shape


@dataclass(frozen=True)
class Rows:
    """What sets the row count, as far as the run shows: a driver and count, or None and why not."""

    driver: RowDriver | None
    fixed: int
    evidence: str
    copies: int = 1
    """The caches each sequence has a row in (a retained cache and a working copy: 2); rows are divided by it."""

    def held(self, peak: CallPeak) -> int:
        """The rows a call's peak held, in the declaration's terms."""
        return peak.rows // self.copies if self.copies > 1 else peak.rows


def _listing(values: Iterable[object]) -> str:
    return ", ".join(str(v) for v in values)


def _held_text(rows: int, caches: int) -> str:
    return f"{rows} rows" + (f" in {caches} caches" if caches > 1 else "")


def infer_rows(peaks: Sequence[CallPeak], max_num_seqs: int | None = None) -> Rows:
    """One row per sequence when every labelled batch held as many rows as its size (or the same multiple of
    it: a row in each of several caches), over two batch sizes at least; a fixed count when the rows stayed
    the same over two batch sizes or more, except that a count equal to ``max_num_seqs`` (the run's), above the
    smallest batch, is a cache sized for ``max_num_seqs`` (a slot per sequence, allocated at first use): one row per
    sequence. Rows are every live cache object's rows added."""
    by_batch: dict[int, tuple[int, int]] = {}
    for peak in peaks:
        if peak.batch is not None:
            by_batch[peak.batch] = max(by_batch.get(peak.batch, (0, 0)), (peak.rows, peak.caches))
    seen = sorted({peak.rows for peak in peaks})
    if len(by_batch) < 2:
        if by_batch:
            ((batch, (rows, caches)),) = by_batch.items()
            return Rows(
                None,
                rows,
                f"the run held {_held_text(rows, caches)} at one batch size ({batch}): drive two batch sizes "
                "(run.batch(n)) to tell one row per sequence from a fixed count",
            )
        return Rows(
            None,
            max(seen, default=0),
            f"the calls held {_listing(seen) or 'no'} rows and no batch sizes were given: drive two batch sizes "
            "under run.batch(n) to tell one row per sequence from a fixed count",
        )
    pairs = _listing(
        f"{_held_text(rows, caches)} at batch {batch}" for batch, (rows, caches) in sorted(by_batch.items())
    )
    multiples = {rows // batch if rows % batch == 0 else 0 for batch, (rows, _) in by_batch.items()}
    if len(multiples) == 1 and 0 not in multiples:
        (copies,) = multiples
        if copies == 1:
            return Rows(RowDriver.MAX_NUM_SEQS, 1, f"one row per sequence: {pairs}")
        return Rows(
            RowDriver.MAX_NUM_SEQS,
            1,
            f"a row per sequence in each of {copies} caches: {pairs} (their positions a row are added up)",
            copies,
        )
    if len({rows for rows, _ in by_batch.values()}) == 1:
        ((rows, caches), *_) = by_batch.values()
        if max_num_seqs is not None and rows == max_num_seqs > min(by_batch):
            return Rows(
                RowDriver.MAX_NUM_SEQS,
                1,
                f"sized for max_num_seqs: {_held_text(rows, caches)} whatever the batch, as many as the run's "
                f"max_num_seqs ({max_num_seqs}): {pairs}",
            )
        return Rows(RowDriver.FIXED, rows, f"{_held_text(rows, caches)} whatever the batch: {pairs}")
    return Rows(
        None, max(rows for rows, _ in by_batch.values()), f"neither one row per sequence nor a fixed count: {pairs}"
    )


@dataclass(frozen=True)
class Capacity:
    """Positions a row at the peak, and whether the run shows them to be a bound."""

    positions: int
    bound: bool
    evidence: str


def per_row_positions(peak: CallPeak, geometry: tuple[int, int, str, int], copies: int = 1) -> int | None:
    """Positions a row of the call's peak, folded over its layers of one cache, for one geometry."""
    for shape in peak.shapes(copies):
        if (shape.kv_heads, shape.head_dim, shape.dtype, shape.element_size) == geometry:
            return shape.positions
    return None


def infer_capacity(peaks: Sequence[CallPeak], shape: Shape, copies: int = 1) -> Capacity:
    """The peak's positions a row are a bound when two calls or more reached them."""
    geometry = (shape.kv_heads, shape.head_dim, shape.dtype, shape.element_size)
    per_call = [(peak.call, per_row_positions(peak, geometry, copies)) for peak in peaks]
    reaching = [call for call, positions in per_call if positions == shape.positions]
    groups = f"{shape.layers} layers x {shape.rows} rows: {shape.groups_text}"
    if len(reaching) >= 2 and not any(reaching):  # a discovered owner: no calls of its own, only batches
        batches = _listing(peak.batch for peak in peaks if per_row_positions(peak, geometry, copies) == shape.positions)
        return Capacity(
            shape.positions,
            True,
            f"{shape.positions} a row at the peak, reached at {len(reaching)} batch labels ({batches}); held as {groups}",
        )
    if len(reaching) >= 2:
        calls = (
            f"calls {reaching[0]}-{reaching[-1]}"
            if reaching == list(range(reaching[0], reaching[-1] + 1))
            else (f"calls {_listing(reaching)}")
        )
        return Capacity(
            shape.positions,
            True,
            f"{shape.positions} a row at the peak, reached in {len(reaching)} calls ({calls}); held as {groups}",
        )
    seen = _listing(sorted({p for _, p in per_call if p is not None}))
    return Capacity(
        shape.positions,
        False,
        f"at least {shape.positions} a row ({groups}), reached in one call only (per call: {seen}): the run does "
        "not show a bound; write the one the code enforces (a window, a maximum length)",
    )


def reached_bound(peaks: Sequence[CallPeak], declarations: Sequence[Declaration], copies: int = 1) -> tuple[bool, str]:
    """Whether the run reached what the declarations are made for: their rows at max_num_seqs and their longest
    positions, in some call. Only then can holding less be called over-reporting; otherwise which bound was
    missed and what the run reached."""
    if not declarations:
        return False, ""
    rows = max((peak.rows // max(1, copies) for peak in peaks), default=0)
    longest = max((peak.longest for peak in peaks), default=0)
    want_rows = max(d.row_count for d in declarations)
    want_positions = max(d.physical_capacity_positions for d in declarations)
    missed = []
    if rows < want_rows:
        missed.append(f"the run held at most {rows} rows of the {want_rows} declared at max_num_seqs")
    if longest < want_positions:
        missed.append(f"at most {longest} positions in a layer of the {want_positions} declared")
    return not missed, "; ".join(missed)


def suggest(owner: str, shape: Shape, rows: Rows, capacity: Capacity, live_after: int | None) -> tuple[Figure, ...]:
    """The figures of a declaration that would hold what one geometry's layers held at the peak."""
    name = spec_name(owner)
    layer_note = (
        f"{shape.layers} layers in one cache at the peak"
        + (f", {shape.caches} caches live at once (rows, not layers)" if shape.caches > 1 else "")
        + (f"; held as {shape.groups_text}, positions a row added up" if len(shape.groups) > 1 else "")
    )
    row_figures: tuple[Figure, ...]
    if rows.driver is RowDriver.MAX_NUM_SEQS:
        row_figures = (Figure("rows", "RowDriver.MAX_NUM_SEQS", rows.evidence),)
    elif rows.driver is RowDriver.FIXED:
        row_figures = (
            Figure("rows", "RowDriver.FIXED", rows.evidence),
            Figure("rows_fixed", str(rows.fixed), rows.evidence),
            Figure("rows_reason", None, "say why the count is fixed (a reviewer reads it)"),
        )
    else:
        row_figures = (Figure("rows", None, rows.evidence),)
    lifetime = (
        "nothing was observed live after the run"
        if not live_after
        else f"{live_after:,} B stayed live after the run: some of it outlives a call"
    )
    return (
        Figure("name", python_string(name), "a name unique within the owner"),
        Figure("layers", str(shape.layers), layer_note),
        Figure("kv_heads", str(shape.kv_heads), f"keys [rows, {shape.kv_heads}, positions, {shape.head_dim}]"),
        Figure("head_dim", str(shape.head_dim), f"keys [rows, {shape.kv_heads}, positions, {shape.head_dim}]"),
        Figure("dtype", dtype_code(shape.dtype), f"the cache tensors' dtype ({shape.element_size} bytes an element)"),
        Figure(
            "physical_capacity_positions",
            str(capacity.positions) if capacity.bound else None,
            capacity.evidence,
        ),
        Figure(
            "capacity_source",
            python_string(f"observed: {capacity.positions} positions a row at the peak") if capacity.bound else None,
            f"replace with {CAPACITY_SOURCE_UNKNOWN}",
        ),
        Figure(
            "scope",
            None,
            f"{SCOPE_UNKNOWN} ({lifetime})",
        ),
        *row_figures,
    )
