"""Discovered owners on /metrics: honest absence, the exporter's owner budget, hostile owner paths.

Every snapshot here is written by the contract's own code (``write_snapshot``, which writes ``Snapshot.to_json``)
and read back by the sidecar's reader.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from modelkv_exporter.contract.snapshot import DiscoveredOwner
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.budget import Budget, snapshot_cost
from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.labels import DIAGNOSTIC_CHARS
from modelkv_exporter.sidecar.reader.scan import SpoolLimits
from modelkv_exporter.sidecar.source import SpoolSource
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.snapshots import make_snapshot
from tests.support.discovered import (
    CENSUS,
    GOLDEN_NOW,
    HOSTILE_OWNER,
    discovery_status,
    golden_discovered_spool,
    make_discovered,
    with_discovery,
)

DISCOVERY_FAMILIES = {
    "modelkv_discovered_peak_bytes",
    "modelkv_discovered_recent_peak_bytes",
    "modelkv_discovered_owner_info",
    "modelkv_engine_discovered_owners",
    "modelkv_discovery_available",
    "modelkv_discovery_census_duration_seconds",
    "modelkv_discovery_census_exhausted",
    "modelkv_discovery_owners_omitted",
}


def scrape(spool: Path, budget: Budget | None = None, reading: SpoolLimits | None = None) -> Exposition:
    source = SpoolSource.budgeted(spool, budget=budget or Budget(), reading=reading, clock=lambda: GOLDEN_NOW)
    body = ExpositionCache(source).render(openmetrics=True, compress=False).data.decode()
    return Exposition(body, openmetrics=True)


def discovery_samples_of(exposition: Exposition, engine: str) -> set[str]:
    return {s.name for s in exposition.samples if s.name in DISCOVERY_FAMILIES and s.labels.get("engine") == engine}


def many_owners(count: int) -> tuple[DiscoveredOwner, ...]:
    """``count`` census owners, one per layer, owner ``i`` holding ``i + 1`` MiB."""
    return tuple(
        make_discovered(f"model.layers.{i}.ring", found_by=CENSUS, peak_bytes=(i + 1) << 20, layout=None)
        for i in range(count)
    )


def test_only_a_writer_that_reports_discovery_gets_discovery_series(spool: Path) -> None:
    """The golden spool: the older writer's engine has no discovery series at all, not zeros; the engine with
    discovery off has its availability 0 and nothing else; the running one has all of its figures."""
    for name, data in golden_discovered_spool().items():
        (spool / name).write_bytes(data)
    exposition = scrape(spool)
    assert exposition.value("modelkv_engine_up", engine="older-writer") == 1, "the older writer is exported"
    assert discovery_samples_of(exposition, "older-writer") == set()
    assert discovery_samples_of(exposition, "minicpmo-audio") == {"modelkv_discovery_available"}
    assert exposition.value("modelkv_discovery_available", engine="minicpmo-audio") == 0
    assert discovery_samples_of(exposition, "qwen3-tts-eager") == DISCOVERY_FAMILIES
    assert exposition.value("modelkv_discovery_available", engine="qwen3-tts-eager") == 1
    peaks = exposition.by("modelkv_discovered_peak_bytes", "owner")
    assert peaks["tokenizer.decoder"] == 8 * 16 * 64 * 72 * 2 * 4 * 4, "the layout's bytes, as the engine sent them"
    (declaring,) = exposition.all("modelkv_discovered_owner_info", owner="decoder")
    assert declaring.labels["declares"] == "true" and declaring.labels["layout"] == ""
    (decoder,) = exposition.all("modelkv_discovered_owner_info", owner="tokenizer.decoder")
    assert decoder.labels["declares"] == "false"
    assert decoder.labels["layout"] == "layers=8 kv_heads=16 head_dim=64 dtype=float32 positions=72 rows=4"
    omitted = exposition.by("modelkv_discovery_owners_omitted", "reason")
    assert omitted == {"below_floor": 3, "over_budget": 1, "exporter_budget": 0}
    assert exposition.value("modelkv_discovery_census_exhausted", engine="qwen3-tts-eager", budget="objects") == 1


def test_a_stale_engine_keeps_no_discovered_figures(spool: Path) -> None:
    snapshot = make_snapshot("late", heartbeat_at=GOLDEN_NOW - 600, interval=1.0)
    write_snapshot(spool, with_discovery(snapshot, many_owners(2), discovery_status()))
    exposition = scrape(spool)
    assert exposition.value("modelkv_engine_up", engine="late") == 0
    assert discovery_samples_of(exposition, "late") == set()


def test_before_the_first_census_its_duration_is_absent_not_zero(spool: Path) -> None:
    snapshot = make_snapshot("young", heartbeat_at=GOLDEN_NOW)
    write_snapshot(spool, with_discovery(snapshot, (), discovery_status(census_at=None, census_seconds=None)))
    exposition = scrape(spool)
    assert exposition.value("modelkv_engine_discovered_owners", engine="young") == 0
    assert "modelkv_discovery_census_duration_seconds" not in exposition
    assert "modelkv_discovery_census_exhausted" not in exposition


def test_a_huge_number_of_discovered_owners_is_bounded_by_the_budget(spool: Path) -> None:
    """20 000 owners in one 4 MiB document: the engine exports the 64 largest and counts the rest; its series
    and label bytes are those of 64 owners. Without the budget the same document is rejected whole: the budget,
    not the document, is what keeps the engine exported."""
    count = 20_000
    snapshot = with_discovery(make_snapshot("hoarder", heartbeat_at=GOLDEN_NOW), many_owners(count), discovery_status())
    write_snapshot(spool, snapshot)
    size = (spool / "hoarder.json").stat().st_size
    reading = SpoolLimits(max_snapshot_bytes=size, max_spool_bytes=size)
    budget = Budget()
    exposition = scrape(spool, budget, reading)
    peaks = exposition.by("modelkv_discovered_peak_bytes", "owner")
    limit = budget.sidecar_max_discovered_owners
    assert len(peaks) == limit == 64
    assert set(peaks) == {f"model.layers.{i}.ring" for i in range(count - limit, count)}, "the largest are kept"
    assert exposition.value("modelkv_engine_discovered_owners", engine="hoarder") == limit
    assert exposition.value("modelkv_discovery_owners_omitted", reason="exporter_budget") == count - limit
    small = with_discovery(snapshot, snapshot.discovered[-limit:], snapshot.discovery)
    assert snapshot_cost(snapshot, limit).series == snapshot_cost(small, limit).series
    mine = [s for s in exposition.samples if s.labels.get("engine") == "hoarder"]
    assert len(mine) == snapshot_cost(snapshot, limit).series

    unbounded = scrape(spool, replace(budget, sidecar_max_discovered_owners=count), reading)
    assert "modelkv_discovered_peak_bytes" not in unbounded
    assert unbounded.value("modelkv_exporter_snapshot_rejections_total", reason="over_budget") == 1


def test_a_full_snapshot_file_of_owners_is_read_and_bounded_at_the_default_limits(spool: Path) -> None:
    """As many owners as the default 256 KiB file holds: read, exported 64, the rest counted."""
    owners = many_owners(1000)
    snapshot = with_discovery(make_snapshot("full", heartbeat_at=GOLDEN_NOW), owners, discovery_status())
    while len(snapshot.to_json()) > SpoolLimits().max_snapshot_bytes:
        owners = owners[: len(owners) * 9 // 10]
        snapshot = replace(snapshot, discovered=owners)
    write_snapshot(spool, snapshot)
    exposition = scrape(spool)
    assert len(exposition.all("modelkv_discovered_peak_bytes", engine="full")) == 64
    assert exposition.value("modelkv_discovery_owners_omitted", reason="exporter_budget") == len(owners) - 64 > 500


def test_exported_owners_keep_the_snapshot_order_and_ties_keep_the_earlier(spool: Path) -> None:
    same = tuple(make_discovered(f"m.{name}", found_by=CENSUS, peak_bytes=5 << 20) for name in "dcba")
    snapshot = with_discovery(make_snapshot("ties", heartbeat_at=GOLDEN_NOW), same, discovery_status())
    write_snapshot(spool, snapshot)
    exposition = scrape(spool, Budget(sidecar_max_discovered_owners=3))
    assert [s.labels["owner"] for s in exposition.all("modelkv_discovered_peak_bytes")] == ["m.d", "m.c", "m.b"]


def test_hostile_owner_paths_become_safe_bounded_labels(spool: Path) -> None:
    """A path with a newline, a bidi override and a tab, 300-odd characters long: printable, cut to 128 with a
    digest; two long paths that share their first 128 characters stay two series."""
    long_a, long_b = "m." + "x" * 200 + ".a", "m." + "x" * 200 + ".b"
    found = tuple(make_discovered(owner, found_by=CENSUS) for owner in (HOSTILE_OWNER, long_a, long_b))
    write_snapshot(spool, with_discovery(make_snapshot("hostile", heartbeat_at=GOLDEN_NOW), found, discovery_status()))
    exposition = scrape(spool)
    owners = [s.labels["owner"] for s in exposition.all("modelkv_discovered_peak_bytes", engine="hostile")]
    assert len(set(owners)) == 3
    for owner in owners:
        assert owner.isprintable() and len(owner) == DIAGNOSTIC_CHARS and owner[-9] == "…", "cut, with a digest"
        assert "\u202e" not in owner and "\n" not in owner and "\t" not in owner
    assert any(owner.startswith("blocks.0 .attn  deeply_nested") for owner in owners)


def test_owner_paths_that_meet_once_sanitised_reject_the_snapshot_like_declarations(spool: Path) -> None:
    """A tab and a newline both become a space: the two series would share their labels, so the snapshot is
    rejected (invalid_snapshot), as a declaration's would be, and another engine stays exported."""
    found = (make_discovered("m.a\tb", found_by=CENSUS), make_discovered("m.a\nb", found_by=CENSUS))
    write_snapshot(spool, with_discovery(make_snapshot("clash", heartbeat_at=GOLDEN_NOW), found, discovery_status()))
    write_snapshot(spool, make_snapshot("fine", heartbeat_at=GOLDEN_NOW))
    exposition = scrape(spool)
    assert {s.labels["engine"] for s in exposition.all("modelkv_engine_up")} == {"fine"}
    assert exposition.value("modelkv_exporter_snapshot_rejections_total", reason="invalid_snapshot") == 1
    apart = (make_discovered("m.a\tb", found_by=CENSUS), make_discovered("m.a\tb"))
    write_snapshot(spool, with_discovery(make_snapshot("clash", heartbeat_at=GOLDEN_NOW), apart, discovery_status()))
    assert len(scrape(spool).all("modelkv_discovered_peak_bytes", engine="clash")) == 2, "found_by tells them apart"


def test_owners_without_a_status_are_exported_but_no_availability_is_claimed(spool: Path) -> None:
    """A writer may send discovered owners and no status: what it found is exported and counted; whether discovery
    runs, its census and the engine's own omissions are not claimed (absent, not 1 or 0)."""
    snapshot = with_discovery(make_snapshot("terse", heartbeat_at=GOLDEN_NOW), many_owners(3), None)
    write_snapshot(spool, snapshot)
    exposition = scrape(spool, Budget(sidecar_max_discovered_owners=2))
    assert discovery_samples_of(exposition, "terse") == {
        "modelkv_discovered_peak_bytes",
        "modelkv_discovered_recent_peak_bytes",
        "modelkv_discovered_owner_info",
        "modelkv_engine_discovered_owners",
        "modelkv_discovery_owners_omitted",
    }
    assert exposition.by("modelkv_discovery_owners_omitted", "reason") == {"exporter_budget": 1}
