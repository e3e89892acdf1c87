"""Plain-text reports of a spool for people: ``inspect`` and ``plan``."""

from __future__ import annotations

import re
from collections.abc import Sequence

from modelkv_exporter.contract.capacity import declared_peak_at, largest_fitting
from modelkv_exporter.contract.scan import SpoolScan
from modelkv_exporter.contract.sizes import human_bytes
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.state import EngineState, SpoolView
from modelkv_exporter.contract.vocabulary import ROOT_OWNER

_NUMERIC = re.compile(r"\d+(\.\d+)?( [KMGT]?i?B)?")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns; numbers and sizes right-aligned."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=False)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if _NUMERIC.fullmatch(c) else c.ljust(w) for c, w in zip(cells, widths, strict=True)
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _engine_heading(snapshot: Snapshot, state: EngineState) -> str:
    who = snapshot.engine
    bits = [f"engine {who.engine_id} [{state.value}]", f"model {who.model_label or '?'}"]
    if who.stage_label:
        bits.append(f"stage {who.stage_label}")
    if who.ranks_label:
        bits.append(who.ranks_label)
    if who.device:
        bits.append(f"device {who.device}")
    bits.append(f"max_num_seqs {snapshot.settings.max_num_seqs}")
    if snapshot.settings.paged_kv_bytes is not None:
        bits.append(f"paged KV {human_bytes(snapshot.settings.paged_kv_bytes)}")
    return ", ".join(bits)


def inspect_report(view: SpoolView) -> str:
    """Every engine's declarations in full, then every rejected file."""
    if not view.scan.ok:
        return f"cannot read the spool: {view.scan.error}"
    parts: list[str] = []
    headers = ["owner", "class", "cache", "scope", "rows", "n", "dtype", "layers x kv_heads x head_dim", "positions",
               "per row", "peak", "capacity source", "rows reason", "note"]  # fmt: skip
    for item in view.usable:
        snapshot = item.snapshot
        parts.append(_engine_heading(snapshot, item.state))
        rows = [
            [
                d.owner or ROOT_OWNER, d.owner_class, d.name, d.scope, d.rows, str(d.row_count), d.dtype,
                f"{d.layers} x {d.kv_heads} x {d.head_dim}", str(d.physical_capacity_positions),
                human_bytes(d.bytes_per_row), human_bytes(d.peak_bytes), d.capacity_source, d.rows_reason,
                d.allocation_note or "",
            ]
            for d in snapshot.declarations
        ]  # fmt: skip
        if rows:
            parts.append(table(headers, rows))
            parts.append(f"declared peak: {human_bytes(snapshot.declared_peak_bytes)}")
        else:
            parts.append("(no declarations)")
        for dropped in snapshot.dropped_declarations or ():
            owner = dropped.owner or ROOT_OWNER
            parts.append(
                f"dropped: {dropped.count} of {owner} ({dropped.owner_class}), {dropped.reason}: {dropped.error}"
            )
        parts.append("")
    rejected = view.rejected
    if rejected:
        parts.append("rejected files:")
        parts += [f"  {e.file_name}: {e.error.reason.value}: {e.error.detail}" for e in rejected if e.error]
    if not parts:
        parts.append("no snapshots in the spool")
    return "\n".join(parts).rstrip() + "\n"


def plan_report(scan: SpoolScan, max_num_seqs: int, budget: int | None) -> str:
    """Declared peak of each engine at ``max_num_seqs`` and, with a budget, the largest that fits."""
    if not scan.ok:
        return f"cannot read the spool: {scan.error}"
    headers = ["engine", "stage", "now", "peak now", f"peak at {max_num_seqs}", "+ per sequence"]
    if budget is not None:
        headers.append(f"largest max_num_seqs within {human_bytes(budget)}")
    rows = []
    for _, snapshot in scan.snapshots:
        if snapshot.ended:
            continue
        row = [
            snapshot.engine.engine_id,
            snapshot.engine.stage_label,
            str(snapshot.settings.max_num_seqs),
            human_bytes(snapshot.declared_peak_bytes),
            human_bytes(declared_peak_at(snapshot, max_num_seqs)),
            human_bytes(snapshot.per_sequence_bytes),
        ]
        if budget is not None:
            fit = largest_fitting(snapshot, budget)
            if fit.max_num_seqs is None:
                row.append("any (nothing scales with it)")
            elif fit.max_num_seqs == 0:
                row.append(f"none: fixed part alone is {human_bytes(fit.fixed_bytes)}")
            else:
                row.append(str(fit.max_num_seqs))
        rows.append(row)
    return (table(headers, rows) if rows else "no live engines in the spool") + "\n"
