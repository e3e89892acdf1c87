"""Valid snapshots and declarations, built without torch."""

from __future__ import annotations

import time
from dataclasses import replace

from modelkv_exporter.contract import arithmetic
from modelkv_exporter.contract.snapshot import (
    Declaration,
    EndState,
    EngineIdentity,
    EngineSettings,
    Measured,
    MemorySample,
    Observation,
    Snapshot,
    TorchSegment,
)
from modelkv_exporter.contract.vocabulary import EndReason, RowDriver


def make_declaration(
    name: str = "cache",
    *,
    owner: str = "decoder",
    layers: int = 8,
    kv_heads: int = 16,
    head_dim: int = 64,
    positions: int = 71,
    element_size: int = 4,
    rows: str = RowDriver.MAX_NUM_SEQS.value,
    rows_fixed: int = 1,
    max_num_seqs: int = 8,
    scope: str = "request",
    capacity_source: str = "sliding_window(72) - 1",
) -> Declaration:
    """A self-consistent declaration resolved at ``max_num_seqs``."""
    per_row = arithmetic.bytes_per_row(
        layers=layers, kv_heads=kv_heads, head_dim=head_dim, positions=positions, element_size=element_size
    )
    count = arithmetic.row_count(rows, rows_fixed, max_num_seqs)
    return Declaration(
        owner=owner,
        owner_class="Owner",
        name=name,
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype={2: "bfloat16", 4: "float32"}.get(element_size, "float64"),
        element_size=element_size,
        physical_capacity_positions=positions,
        capacity_source=capacity_source,
        scope=scope,
        rows=rows,
        rows_fixed=rows_fixed,
        rows_reason="because" if rows == RowDriver.FIXED.value else "",
        allocation_note=None,
        bytes_per_row=per_row,
        row_count=count,
        peak_bytes=per_row * count,
    )


def make_observation(
    owner: str = "decoder",
    *,
    peak_bytes: int | None = 1 << 20,
    recent_peak_bytes: int | None = None,
    live_bytes: int | None = None,
    calls: int | None = 10,
    cache_calls: int | None = None,
    reason: str | None = None,
) -> Observation:
    """An owner's observation: available with the given figures, or unavailable when ``reason`` is given."""
    if reason is not None:
        return Observation(owner, "Owner", False, reason, calls=calls)
    return Observation(
        owner,
        "Owner",
        True,
        peak_bytes=peak_bytes,
        recent_peak_bytes=peak_bytes if recent_peak_bytes is None else recent_peak_bytes,
        live_bytes=peak_bytes if live_bytes is None else live_bytes,
        calls=calls,
        cache_calls=calls if cache_calls is None else cache_calls,
    )


def make_snapshot(
    engine_id: str = "engine-a",
    *,
    declarations: tuple[Declaration, ...] | None = None,
    max_num_seqs: int | None = 8,
    heartbeat_at: float | None = None,
    interval: float | None = None,
    measured: dict[str, int] | None = None,
    baseline: dict[str, int] | None = None,
    observations: tuple[Observation, ...] = (),
    **identity: object,
) -> Snapshot:
    """A valid snapshot for engine ``engine_id`` (without ``max_num_seqs``, its default declaration is fixed-row)."""
    now = time.time() if heartbeat_at is None else heartbeat_at
    if declarations is None:
        declarations = (
            make_declaration(max_num_seqs=max_num_seqs)
            if max_num_seqs is not None
            else make_declaration(rows=RowDriver.FIXED.value, rows_fixed=2),
        )
    return Snapshot(
        engine=EngineIdentity(
            engine_id=engine_id,
            served_model_name=identity.pop("served_model_name", "m"),  # type: ignore[arg-type]
            **identity,  # type: ignore[arg-type]
        ),
        settings=EngineSettings(max_num_seqs=max_num_seqs),
        declarations=declarations,
        started_at=now - 10,
        heartbeat_at=now,
        heartbeat_interval_seconds=interval,
        measured=Measured(
            current=None if measured is None else MemorySample(now, measured),
            baseline=None if baseline is None else MemorySample(now - 5, baseline),
        ),
        writer="tests",
        observations=observations,
    )


def ended(
    snapshot: Snapshot,
    reason: str = EndReason.OUT_OF_MEMORY.value,
    *,
    error: str | None = None,
    reserved_free_bytes: int | None = None,
    segments: tuple[tuple[int, int], ...] | None = None,
) -> Snapshot:
    """``snapshot`` as its engine's ending write leaves it: ``ended``, with ``end`` (at its heartbeat) giving
    ``reason``; ``segments`` are (total, allocated) bytes of torch's largest segments. A shutdown has no error; any
    other reason gets a torch-like one unless ``error`` is given."""
    if error is None:
        error = {
            EndReason.SHUTDOWN.value: "",
            EndReason.OUT_OF_MEMORY.value: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        }.get(reason, "RuntimeError: boom")
    end = EndState(
        reason=reason,
        at=snapshot.heartbeat_at,
        error=error,
        reserved_free_bytes=reserved_free_bytes,
        largest_segments=None if segments is None else tuple(TorchSegment(t, a) for t, a in segments),
    )
    return replace(snapshot, ended=True, end=end)
