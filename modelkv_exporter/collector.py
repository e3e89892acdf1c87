"""The Prometheus collector over the spool: fresh families from the snapshots on every scrape.

A bad file never fails the scrape: it is skipped and counted. An engine whose
snapshot is marked ended disappears; one whose heartbeat is stale keeps only its
identity and ``modelkv_engine_up 0`` (its memory is gone with it).
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

from prometheus_client.metrics_core import Metric as Family

from modelkv_exporter import __version__
from modelkv_exporter.catalogue import CATALOGUE, MEASUREMENTS
from modelkv_exporter.snapshot import SCHEMA_VERSION, Snapshot
from modelkv_exporter.snapshot_parse import RejectReason
from modelkv_exporter.spool import SpoolReader

DEFAULT_STALE_AFTER_SECONDS = 30.0
ROOT_OWNER = "(root)"


def label(text: str | None, limit: int = 128) -> str:
    """A safe label value: control characters become spaces, long text is cut with an ellipsis."""
    if not text:
        return ""
    if not text.isprintable():
        text = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_stale(snapshot: Snapshot, now: float, stale_after: float) -> bool:
    """Stale when a beating snapshot missed its heartbeats: older than max(stale_after, 3 intervals).

    A one-shot snapshot (no heartbeat interval) promises no heartbeat and is never stale.
    """
    interval = snapshot.heartbeat_interval_seconds
    if interval is None:
        return False
    return now - snapshot.heartbeat_at > max(stale_after, 3 * interval)


def engine_labels(snapshot: Snapshot) -> list[str]:
    """The engine, model and stage label values of a snapshot."""
    who = snapshot.engine
    return [label(who.engine_id, 256), label(who.model_label, 256), label(who.stage_label)]


def snapshot_age(snapshot: Snapshot, now: float) -> float:
    """Seconds since the snapshot's heartbeat, never negative."""
    return max(0.0, now - snapshot.heartbeat_at)


Add = Callable[[str, list[str], float], None]
Info = Callable[[str, list[str]], None]


def exporter_samples(
    scan_ok: bool, states: Mapping[str, int], rejections: Mapping[str, int], add: Add, info: Info
) -> None:
    """The exporter's own samples, but for the collect duration."""
    info("modelkv_exporter_build_info", [__version__, str(SCHEMA_VERSION)])
    add("modelkv_exporter_spool_scan_success", [], 1.0 if scan_ok else 0.0)
    for state, count in states.items():
        add("modelkv_exporter_spool_files", [state], count)
    for reason in RejectReason:
        add("modelkv_exporter_snapshot_rejections_total", [reason.value], rejections.get(reason.value, 0))


def engine_state(snapshot: Snapshot, now: float, stale_after: float) -> str:
    """``ended``, ``stale`` or ``exported``: the one place an engine's state is decided."""
    if snapshot.ended:
        return "ended"
    return "stale" if is_stale(snapshot, now, stale_after) else "exported"


class SpoolCollector:
    """A ``prometheus_client`` collector that exports the spool's snapshots."""

    def __init__(
        self,
        reader: SpoolReader,
        *,
        stale_after: float = DEFAULT_STALE_AFTER_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reader = reader
        self.stale_after = stale_after
        self.clock = clock

    def describe(self) -> list[Family]:
        """Nothing up front: families depend on the spool, so registration does not scrape."""
        return []

    def collect(self) -> Iterator[Family]:
        """Read the spool and yield every non-empty family for this scrape."""
        started = time.perf_counter()
        families = {name: metric.family() for name, metric in CATALOGUE.items()}

        def add(name: str, labels: list[str], value: float) -> None:
            cast(Any, families[name]).add_metric(labels, value)

        def info(name: str, labels: list[str]) -> None:
            metric = CATALOGUE[name]
            cast(Any, families[name]).add_metric(labels, dict(zip(metric.labels, labels, strict=True)))

        scan = self.reader.scan()
        now = self.clock()
        states = {"exported": 0, "stale": 0, "ended": 0, "rejected": 0}
        for entry in scan.entries:
            snapshot = entry.snapshot
            if snapshot is None:
                states["rejected"] += 1
                continue
            state = engine_state(snapshot, now, self.stale_after)
            states[state] += 1
            if state != "ended":
                self.engine_samples(snapshot, state == "stale", add, info)
                add("modelkv_engine_snapshot_age_seconds", engine_labels(snapshot), snapshot_age(snapshot, now))

        exporter_samples(scan.ok, states, self.reader.rejections, add, info)
        add("modelkv_exporter_collect_duration_seconds", [], time.perf_counter() - started)
        return (family for family in families.values() if family.samples)

    @staticmethod
    def engine_samples(snapshot: Snapshot, stale: bool, add: Add, info: Info) -> None:
        """Every sample of one engine that depends only on its snapshot and staleness (not on the clock)."""
        who = snapshot.engine
        engine = engine_labels(snapshot)
        info(
            "modelkv_engine_info",
            [
                *engine,
                label(who.architecture),
                label(who.replica),
                who.ranks_label,
                label(who.device),
                label(snapshot.writer),
            ],
        )
        add("modelkv_engine_up", engine, 0.0 if stale else 1.0)
        add("modelkv_engine_start_time_seconds", engine, snapshot.started_at)
        if stale:
            return

        settings = snapshot.settings
        add("modelkv_engine_declarations", engine, len(snapshot.declarations))
        add("modelkv_engine_max_num_seqs", engine, settings.max_num_seqs)
        add("modelkv_engine_declared_per_sequence_bytes", engine, snapshot.per_sequence_bytes)
        optional = (
            ("modelkv_engine_gpu_memory_utilization_ratio", settings.gpu_memory_utilization),
            ("modelkv_engine_paged_kv_bytes", settings.paged_kv_bytes),
            ("modelkv_engine_paged_kv_blocks", settings.paged_kv_blocks),
        )
        for name, value in optional:
            if value is not None:
                add(name, engine, value)

        for d in snapshot.declarations:
            owner = label(d.owner or ROOT_OWNER)
            series = [*engine, owner, label(d.name), d.scope, d.rows]
            add("modelkv_declared_peak_bytes", series, d.peak_bytes)
            add("modelkv_declared_row_size_bytes", series, d.bytes_per_row)
            add("modelkv_declared_rows", series, d.row_count)
            add("modelkv_declared_capacity_positions", series, d.physical_capacity_positions)
            info(
                "modelkv_declaration_info",
                [
                    engine[0],
                    owner,
                    label(d.name),
                    label(d.dtype),
                    f"{d.layers}x{d.kv_heads}x{d.head_dim}",
                    label(d.capacity_source),
                    label(d.rows_reason),
                    label(d.allocation_note),
                ],
            )

        current = snapshot.measured.current
        baseline = snapshot.measured.baseline
        for m in MEASUREMENTS:
            value = None if current is None else current.values.get(m.source)
            add("modelkv_memory_measurement_available", [*engine, m.source], 0.0 if value is None else 1.0)
            if value is not None:
                add(f"modelkv_memory_{m.source}_bytes", engine, value)
            base = None if baseline is None else baseline.values.get(m.source)
            if m.baseline and base is not None:
                add(f"modelkv_memory_{m.source}_baseline_bytes", engine, base)
