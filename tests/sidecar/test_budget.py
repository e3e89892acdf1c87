"""The sidecar's budget: a snapshot over it is rejected as over_budget and counted, every other engine stays exported,
and no two series of one scrape carry the same labels once sanitised."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from modelkv_exporter.contract.snapshot import DroppedDeclaration
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.budget import Budget, snapshot_cost
from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.source import SpoolSource
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.snapshots import make_declaration, make_snapshot
from modelkv_testbed.worst_spool import write_worst_spool

LIMIT = Budget().sidecar_max_discovered_owners


def source(spool: Path, budget: Budget) -> SpoolSource:
    return SpoolSource.budgeted(spool, budget=budget)


def rendered(src: SpoolSource, openmetrics: bool = False) -> Exposition:
    body = ExpositionCache(src).render(openmetrics=openmetrics, compress=False).data.decode()
    return Exposition(body, openmetrics=openmetrics)


def declarations(count: int, **kwargs: object) -> tuple:
    return tuple(make_declaration(f"c{i}", **kwargs) for i in range(count))  # type: ignore[arg-type]


def rejected(src: SpoolSource) -> dict[str, tuple[str, str]]:
    view = src.view()
    return {e.file_name: (e.error.reason.value, e.error.detail) for e in view.rejected if e.error}


def test_a_snapshot_over_its_budget_is_rejected_and_counted_and_others_stay(spool: Path) -> None:
    write_snapshot(spool, make_snapshot("many", declarations=declarations(11)))
    write_snapshot(spool, make_snapshot("wordy", declarations=declarations(10, owner="o" * 100)))
    write_snapshot(spool, make_snapshot("fine", declarations=declarations(10)))
    fine_bytes = snapshot_cost(make_snapshot("fine", declarations=declarations(10)), LIMIT).label_bytes
    src = source(spool, Budget(max_declarations=10, max_label_bytes=fine_bytes))
    found = rejected(src)
    assert found["many.json"] == ("over_budget", "11 declarations > limit 10")
    assert found["wordy.json"][0] == "over_budget" and "bytes of label values > limit" in found["wordy.json"][1]
    assert len(found) == 2
    exposition = rendered(src)
    assert {s.labels["engine"] for s in exposition.all("modelkv_engine_up")} == {"fine"}
    assert exposition.value("modelkv_exporter_snapshot_rejections_total", reason="over_budget") == 2
    src.view()
    assert src.reader.rejections["over_budget"] == 2, "each file version counted once"


def test_entries_of_dropped_declarations_are_held_to_the_declaration_budget(spool: Path) -> None:
    # entries of one owner and reason merge into one series: no label bytes would bound how many a file keeps
    def dropping(engine: str, entries: int) -> None:
        drop = DroppedDeclaration("m.x", "X", "declarer_raised", 1, "RuntimeError: no")
        write_snapshot(spool, replace(make_snapshot(engine), dropped_declarations=(drop,) * entries))

    dropping("hoarder", 11)
    dropping("fine", 10)
    src = source(spool, Budget(max_declarations=10))
    assert rejected(src) == {"hoarder.json": ("over_budget", "11 entries of dropped declarations > limit 10")}
    assert rendered(src).value("modelkv_declarations_dropped", engine="fine", owner="m.x") == 10


def test_the_scrape_takes_engines_in_file_order_until_its_series_budget(spool: Path) -> None:
    one = make_snapshot("a", declarations=declarations(5))
    per_engine = snapshot_cost(one, LIMIT).series
    for name in ("a", "b", "c"):
        write_snapshot(spool, replace(one, engine=replace(one.engine, engine_id=name)))
    src = source(spool, Budget(max_series=2 * per_engine))
    assert set(rejected(src)) == {"c.json"}
    assert "series would take the scrape past" in rejected(src)["c.json"][1]
    exposition = rendered(src)
    assert {s.labels["engine"] for s in exposition.all("modelkv_engine_up")} == {"a", "b"}
    series = [s for s in exposition.samples if s.labels.get("engine") in ("a", "b")]
    assert len(series) == 2 * per_engine, "the budget counts exactly the series the scrape carries"
    assert src.reader.rejections["over_budget"] == 1
    (spool / "a.json").unlink()
    assert rejected(src) == {}, "room again: c is exported"
    assert src.reader.rejections["over_budget"] == 1


def test_the_scrape_label_byte_budget(spool: Path) -> None:
    one = make_snapshot("a" * 100, declarations=declarations(3))
    write_snapshot(spool, one)
    write_snapshot(spool, replace(one, engine=replace(one.engine, engine_id="b" * 100)))
    src = source(spool, Budget(max_scrape_label_bytes=snapshot_cost(one, LIMIT).label_bytes + 10))
    assert [reason for reason, _ in rejected(src).values()] == ["over_budget"]


def test_labels_that_meet_once_sanitised_never_reach_a_scrape(spool: Path) -> None:
    # finding 7: names that differed only past the cut, or by a tab against a newline
    long_a, long_b = "x" * 128 + "A", "x" * 128 + "B"
    write_snapshot(spool, make_snapshot("long", declarations=(make_declaration(long_a), make_declaration(long_b))))
    write_snapshot(spool, make_snapshot("vic\ttim"))
    write_snapshot(spool, make_snapshot("vic\ntim"))
    write_snapshot(spool, make_snapshot("same", declarations=(make_declaration("a\tb"), make_declaration("a\nb"))))
    src = source(spool, Budget())
    reasons = {name: reason for name, (reason, _) in rejected(src).items()}
    assert sorted(reasons.values()) == ["duplicate_engine", "invalid_snapshot"]
    assert any(name.startswith("same") for name, r in reasons.items() if r == "invalid_snapshot")
    for openmetrics in (False, True):
        exposition = rendered(src, openmetrics)  # the OpenMetrics parser refuses a body with duplicate series
        caches = {s.labels["cache"] for s in exposition.all("modelkv_declared_peak_bytes", engine="long")}
        assert len(caches) == 2, "cut labels stay apart by their digest"
        assert len(exposition.all("modelkv_engine_up", engine="vic tim")) == 1


def test_cost_counts_what_a_stale_engine_would_not_export(spool: Path) -> None:
    fresh = make_snapshot("e", declarations=declarations(4), interval=1.0)
    write_snapshot(spool, fresh)
    src = source(spool, Budget())
    cost = snapshot_cost(fresh, LIMIT)
    exposition = rendered(src)
    mine = [s for s in exposition.samples if s.labels.get("engine") == "e"]
    assert cost.series == len(mine)
    assert cost.label_bytes == sum(len(v.encode()) for s in mine for v in s.labels.values())


def test_the_worst_admitted_spool_is_admitted_whole(spool: Path) -> None:
    worst = write_worst_spool(spool)
    src = source(spool, Budget())
    view = src.view()
    assert {e.snapshot.engine.engine_id for e in (i.entry for i in view.exported) if e.snapshot} == set(worst.engines)
    assert {e.error.reason.value for e in view.rejected if e.error} == {"invalid_snapshot"}, "only the junk files"
    budget = Budget()
    assert budget.max_series - 100 <= worst.series <= budget.max_series
