"""The worst spool the sidecar's default budgets admit: every limit filled at once, for memory and latency bounds.

- a few engines of ``max_declarations`` declarations whose label text brings each near
  ``max_label_bytes``, written with quotes and backslashes (each escaped to two bytes in the
  exposition) and padded with non-label text to ``max_snapshot_bytes``;
- then engines without declarations whose identity labels are as long as labels get
  (256 four-byte characters) until the scrape's ``max_series`` or ``max_scrape_label_bytes``;
- every file within ``max_spool_bytes`` and ``max_spool_files``, so that all are admitted;
- first by name, hostile files that are read and rejected (junk JSON of many small values at
  ``max_snapshot_bytes``, the costliest thing to parse).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.budget import Budget, snapshot_cost
from modelkv_exporter.sidecar.reader.scan import SpoolLimits
from modelkv_testbed.snapshots import make_declaration, make_snapshot

WIDE = "\U0001f600"
"""A four-byte character: the most label bytes per character."""


@dataclass(frozen=True)
class WorstSpool:
    """What ``write_worst_spool`` wrote."""

    engines: list[str]
    series: int
    label_bytes: int
    file_bytes: int
    junk_files: int


def _padded(snapshot: Snapshot, size: int) -> Snapshot:
    """``snapshot`` with its first declaration's owner class (not a label) grown until the file is ``size`` bytes."""
    first = snapshot.declarations[0]
    room = size - len(snapshot.to_json()) - 1
    if room <= 0:
        return snapshot
    grown = replace(first, owner_class=first.owner_class + "c" * room)
    return replace(snapshot, declarations=(grown, *snapshot.declarations[1:]))


def big_engine(index: int, budget: Budget, max_bytes: int) -> Snapshot:
    """``max_declarations`` declarations, label text just within ``max_label_bytes``, file padded to ``max_bytes``."""
    count = budget.max_declarations
    low, high = 1, 128
    best = None
    while low <= high:
        width = (low + high) // 2
        text = ('"\\' * 64)[:width]
        declarations = tuple(
            make_declaration(f"{i:04d}{text}", owner=f"m.layers.{i}.{text}", capacity_source=text) for i in range(count)
        )
        snapshot = make_snapshot(f"big-{index:03d}-" + text, declarations=declarations, interval=5.0)
        if (
            snapshot_cost(snapshot, Budget().sidecar_max_discovered_owners).label_bytes <= budget.max_label_bytes
            and len(snapshot.to_json()) <= max_bytes
        ):
            best, low = snapshot, width + 1
        else:
            high = width - 1
    assert best is not None
    return _padded(best, max_bytes - 64)


def wide_engine(index: int) -> Snapshot:
    """No declarations; engine, model and stage labels as long as labels get, in four-byte characters."""
    return make_snapshot(
        f"wide-{index:03d}-" + WIDE * 247,
        declarations=(),
        interval=5.0,
        served_model_name=WIDE * 300,
        stage_name=WIDE * 200,
        architecture=WIDE * 200,
        replica=WIDE * 200,
        device=WIDE * 200,
    )


def junk(size: int) -> bytes:
    """Valid JSON of many empty lists: the most parse work and memory per byte; rejected as invalid_snapshot."""
    return b'{"junk":[' + b",".join([b"[]"] * ((size - 12) // 3)) + b"]}"


def write_worst_spool(
    spool: Path,
    budget: Budget | None = None,
    *,
    max_bytes: int = SpoolLimits.max_snapshot_bytes,
    max_spool_bytes: int = SpoolLimits.max_spool_bytes,
    max_files: int = SpoolLimits.max_spool_files,
    junk_files: int = 2,
) -> WorstSpool:
    """Fill ``spool`` as described above; the totals are what the sidecar's budget check counts."""
    budget = budget or Budget()
    series = label_bytes = file_bytes = 0
    engines: list[str] = []
    for i in range(junk_files):
        file_bytes += (spool / f"000-junk-{i}.json").write_bytes(junk(max_bytes))
    first = big_engine(0, budget, max_bytes)
    candidates = (replace(first, engine=replace(first.engine, engine_id=f"big-{i:03d}")) for i in range(max_files))

    def fits(snapshot: Snapshot) -> bool:
        cost = snapshot_cost(snapshot, Budget().sidecar_max_discovered_owners)
        size = len(snapshot.to_json())
        return (
            len(engines) + junk_files < max_files
            and series + cost.series <= budget.max_series
            and label_bytes + cost.label_bytes <= budget.max_scrape_label_bytes
            and file_bytes + size <= max_spool_bytes
        )

    for stream in (candidates, (wide_engine(i) for i in range(max_files))):
        for snapshot in stream:
            if not fits(snapshot):
                break
            cost = snapshot_cost(snapshot, Budget().sidecar_max_discovered_owners)
            series, label_bytes = series + cost.series, label_bytes + cost.label_bytes
            file_bytes += len(write_snapshot(spool, snapshot).read_bytes())
            engines.append(snapshot.engine.engine_id)
    return WorstSpool(engines, series, label_bytes, file_bytes, junk_files)


def describe(worst: WorstSpool) -> str:
    """One line for a benchmark's output."""
    return json.dumps(
        {
            "engines": len(worst.engines),
            "series": worst.series,
            "label_bytes": worst.label_bytes,
            "file_bytes": worst.file_bytes,
            "junk_files": worst.junk_files,
            "limits": {
                "max_series": Budget.max_series,
                "max_scrape_label_bytes": Budget.max_scrape_label_bytes,
            },
        }
    )
