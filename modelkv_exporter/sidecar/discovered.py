"""Which of an engine's discovered owners the sidecar exports, how a discovered layout is written, and what
discovery's state says in words.

An engine publishes the modules that hold cache memory they do not declare (``Snapshot.discovered``);
the sidecar exports at most ``Budget.sidecar_max_discovered_owners`` of them per engine:
the largest by peak, listed in the snapshot's order, the rest counted as omitted. /metrics, the landing
page and ``/api/v1/engines`` all pick them here, so they agree; the landing page and ``inspect`` say what
discovery covered in the words of ``discovery_facts``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from modelkv_exporter.contract.snapshot import DiscoveredOwner, DiscoveryStatus, KVLayout, Snapshot


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


class Fact(NamedTuple):
    """One thing discovery's status says, and whether it calls for attention (a census cut short)."""

    text: str
    urgent: bool = False


def discovery_facts(status: DiscoveryStatus, quote: Callable[[str], str]) -> tuple[Fact, ...]:
    """What a running discovery covered and left out, in order; ``quote`` makes the snapshot's text safe to show.

    Discovery that is off says only why (``status.reason``): the caller words that one itself.
    """
    facts = []
    if status.census_seconds is not None:
        facts.append(
            Fact(
                f"last census {status.modules} modules, {status.objects} objects in {status.census_seconds * 1000:.1f} ms"
            )
        )
    if status.budget_exhausted:
        facts.append(Fact(f"the census ran out of its {quote(status.budget_exhausted)} budget", urgent=True))
    if status.owners_below_floor:
        facts.append(Fact(f"{status.owners_below_floor} owners below the engine's size floor"))
    if status.owners_over_budget:
        facts.append(Fact(f"{status.owners_over_budget} past the engine's owner budget"))
    return tuple(facts)
