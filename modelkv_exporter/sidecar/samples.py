"""The samples of one engine's snapshot, and the exporter's own, as calls of ``add`` and ``info``.

The collector (prometheus_client families) and the exposition cache (text lines) both feed
on these functions, so both render the same samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from modelkv_exporter.contract.snapshot import SCHEMA_VERSION, Snapshot
from modelkv_exporter.contract.version import VERSION
from modelkv_exporter.contract.vocabulary import MEASUREMENTS
from modelkv_exporter.sidecar.breakdown import breakdown
from modelkv_exporter.sidecar.discovered import (
    discovery_running,
    exported_discovery,
    layout_text,
)
from modelkv_exporter.sidecar.label_values import ROOT_OWNER, Refusal
from modelkv_exporter.sidecar.labels import engine_labels, label
from modelkv_exporter.sidecar.post_mortem import post_mortem
from modelkv_exporter.sidecar.prescription import prescription
from modelkv_exporter.sidecar.reader.decode import RejectReason
from modelkv_exporter.sidecar.reader.state import LIVE_STATES, EngineState

Add = Callable[[str, list[str], float], None]
Info = Callable[[str, list[str]], None]


def exporter_samples(
    scan_ok: bool, states: Mapping[EngineState, int], rejections: Mapping[str, int], add: Add, info: Info
) -> None:
    """The exporter's own samples, but for the collect duration and the HTTP server's refusals."""
    info("modelkv_exporter_build_info", [VERSION, str(SCHEMA_VERSION)])
    add("modelkv_exporter_spool_scan_success", [], 1.0 if scan_ok else 0.0)
    for state, count in states.items():
        add("modelkv_exporter_spool_files", [state.value], count)
    for reason in RejectReason:
        add("modelkv_exporter_snapshot_rejections_total", [reason.value], rejections.get(reason.value, 0))


def refusal_samples(refusals: Mapping[str, int], add: Add) -> None:
    """The HTTP server's refusals by reason, every reason present (exported only where a server counts them)."""
    for refusal in Refusal:
        add("modelkv_exporter_http_refusals_total", [refusal.value], refusals.get(refusal.value, 0))


def engine_samples(snapshot: Snapshot, stale: bool, add: Add, info: Info, max_discovered: int) -> None:
    """Every sample of one engine that depends only on its snapshot and staleness (not on the clock); at most
    ``max_discovered`` of its discovered owners."""
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
    prescribed = prescription(snapshot)
    add("modelkv_engine_declarations", engine, len(snapshot.declarations))
    add("modelkv_engine_declared_per_sequence_bytes", engine, snapshot.per_sequence_bytes)
    optional = (
        ("modelkv_engine_max_num_seqs", settings.max_num_seqs),
        ("modelkv_engine_gpu_memory_utilization_ratio", settings.gpu_memory_utilization),
        ("modelkv_engine_paged_kv_bytes", settings.paged_kv_bytes),
        ("modelkv_engine_paged_kv_blocks", settings.paged_kv_blocks),
        ("modelkv_engine_paged_kv_reserved_bytes", settings.paged_kv_reserved_bytes),
        ("modelkv_engine_paged_kv_reserved_blocks", settings.paged_kv_reserved_blocks),
        ("modelkv_engine_torch_headroom_bytes", settings.torch_headroom_bytes),
        ("modelkv_engine_sleep_level", None if snapshot.sleep is None else snapshot.sleep.level),
        ("modelkv_engine_prescribed_kv_cache_bytes", prescribed.kv_cache_bytes),
        ("modelkv_engine_prescribed_torch_headroom_bytes", prescribed.headroom_bytes),
    )
    for name, value in optional:
        if value is not None:
            add(name, engine, value)

    if snapshot.dropped_count is not None:
        add("modelkv_engine_declarations_dropped", engine, snapshot.dropped_count)
    dropped: dict[tuple[str, str], int] = {}
    for item in snapshot.dropped_declarations or ():
        key = (label(item.owner or ROOT_OWNER), label(item.reason))
        dropped[key] = dropped.get(key, 0) + item.count
    for (owner_label, reason), count in dropped.items():
        add("modelkv_declarations_dropped", [*engine, owner_label, reason], count)

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
                engine[1],
                engine[2],
            ],
        )

    observation_samples(snapshot, engine, add)
    discovery_samples(snapshot, engine, add, info, max_discovered)

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
    parts = breakdown(snapshot)
    for component, value in () if parts is None else parts.parts.items():
        add("modelkv_memory_breakdown_bytes", [*engine, component], value)


def shown_samples(snapshot: Snapshot, state: EngineState, add: Add, info: Info, max_discovered: int) -> None:
    """Every sample of one engine in ``state`` that /metrics shows: a live engine's (``engine_samples``; a vanished one
    as a stale one), then the end of one that died (``end_samples``)."""
    if state in LIVE_STATES:
        engine_samples(snapshot, state is not EngineState.EXPORTED, add, info, max_discovered)
    end_samples(snapshot, state, add)


def end_samples(snapshot: Snapshot, state: EngineState, add: Add) -> None:
    """Why an engine died, when, what grew and torch's free reserved bytes then (``sidecar.post_mortem``); nothing
    for an engine that lives or shut down."""
    dead = post_mortem(snapshot, state)
    if dead is None:
        return
    engine = engine_labels(snapshot)
    add("modelkv_engine_ended_timestamp_seconds", [*engine, label(dead.reason)], dead.at)
    for part, grown in dead.grown.items():
        add("modelkv_engine_end_growth_bytes", [*engine, part], grown)
    if dead.reserved_free_bytes is not None:
        add("modelkv_engine_end_torch_reserved_free_bytes", engine, dead.reserved_free_bytes)


def observation_samples(snapshot: Snapshot, engine: list[str], add: Add) -> None:
    """Per declaring owner, whether its caches are observed and, only when they are, what they held."""
    for owner, observation in snapshot.owners().items():
        series = [*engine, label(owner or ROOT_OWNER)]
        available = observation is not None and observation.available
        add("modelkv_observation_available", series, 1.0 if available else 0.0)
        if observation is None:
            continue
        if observation.calls is not None:
            add("modelkv_observed_owner_calls_total", series, observation.calls)
        if not available:
            continue
        figures = (
            ("modelkv_observed_peak_bytes", observation.peak_bytes),
            ("modelkv_observed_recent_peak_bytes", observation.recent_peak_bytes),
            ("modelkv_observed_calls_total", observation.cache_calls),
        )
        for name, value in figures:
            if value is not None:
                add(name, series, value)


def discovery_samples(snapshot: Snapshot, engine: list[str], add: Add, info: Info, limit: int) -> None:
    """Whether the engine runs discovery and, only while it does, the owners it found (``limit`` at most), what
    its census covered, and how many owners were left out. Nothing from a writer that does not report discovery."""
    status = snapshot.discovery
    if status is not None:
        add("modelkv_discovery_available", engine, 1.0 if status.enabled else 0.0)
    if not discovery_running(snapshot):
        return
    exported = exported_discovery(snapshot, limit)
    add("modelkv_engine_discovered_owners", engine, len(exported.owners))
    for found in exported.owners:
        owner, found_by = label(found.owner or ROOT_OWNER), label(found.found_by)
        series = [*engine, owner, found_by]
        add("modelkv_discovered_peak_bytes", series, found.peak_bytes)
        add("modelkv_discovered_recent_peak_bytes", series, found.recent_peak_bytes)
        declares = "true" if found.declares else "false"
        info(
            "modelkv_discovered_owner_info",
            [engine[0], owner, label(found.owner_class), found_by, declares, label(layout_text(found.layout)),
             engine[1], engine[2]],
        )  # fmt: skip
    omitted = {"exporter_budget": exported.omitted}
    if status is not None:
        omitted = {"below_floor": status.owners_below_floor, "over_budget": status.owners_over_budget, **omitted}
        if status.census_seconds is not None:
            add("modelkv_discovery_census_duration_seconds", engine, status.census_seconds)
        if status.budget_exhausted is not None:
            add("modelkv_discovery_census_exhausted", [*engine, label(status.budget_exhausted)], 1.0)
    for reason, count in omitted.items():
        add("modelkv_discovery_owners_omitted", [*engine, reason], count)
