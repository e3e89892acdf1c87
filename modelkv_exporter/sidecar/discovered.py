"""Which of an engine's discovered owners the sidecar exports, and how a discovered layout is written as a label.

An engine publishes the modules that hold cache memory they do not declare (``Snapshot.discovered``);
the sidecar exports at most ``Budget.sidecar_max_discovered_owners`` of them per engine:
the largest by peak, listed in the snapshot's order, the rest counted as omitted. /metrics, the landing
page and ``/api/v1/engines`` all pick them here, so they agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelkv_exporter.contract.snapshot import DiscoveredOwner, KVLayout, Snapshot


@dataclass(frozen=True)
class ExportedDiscovery:
    """What the sidecar exports of one snapshot's discovery: the owners within the budget, and how many it left out."""

    owners: tuple[DiscoveredOwner, ...]
    omitted: int


def reports_discovery(snapshot: Snapshot) -> bool:
    """Whether the snapshot's writer reports discovery at all (older writers send neither field)."""
    return snapshot.discovery is not None or bool(snapshot.discovered)


def discovery_running(snapshot: Snapshot) -> bool:
    """Whether discovered figures are to be shown: the writer reports discovery and does not say it is off."""
    return reports_discovery(snapshot) and (snapshot.discovery is None or snapshot.discovery.enabled)


def exported_discovery(snapshot: Snapshot, limit: int) -> ExportedDiscovery:
    """The ``limit`` discovered owners with the largest peaks (ties: the earlier entry), in the snapshot's order.

    Nothing when discovery is off: its owners are then not shown, and none counts as omitted.
    """
    discovered = snapshot.discovered if discovery_running(snapshot) else ()
    if len(discovered) <= limit:
        return ExportedDiscovery(discovered, 0)
    ranked = sorted(range(len(discovered)), key=lambda i: (-discovered[i].peak_bytes, i))
    kept = sorted(ranked[:limit])
    return ExportedDiscovery(tuple(discovered[i] for i in kept), len(discovered) - limit)


def layout_text(layout: KVLayout | None) -> str:
    """``layers=28 kv_heads=8 head_dim=128 dtype=bfloat16 positions=4096 rows=4``, or "" when none was seen."""
    if layout is None:
        return ""
    return (
        f"layers={layout.layers} kv_heads={layout.kv_heads} head_dim={layout.head_dim} dtype={layout.dtype} "
        f"positions={layout.positions} rows={layout.rows}"
    )
