"""The collector: fresh families per scrape, honest absence, staleness, label safety, catalogue agreement."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from modelkv_exporter.contract.snapshot import DroppedDeclaration, EngineSettings, SleepState
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.contract.vocabulary import MEASUREMENTS
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.sidecar.catalogue import CATALOGUE, MAX_INFO_LABELS, MAX_LABELS
from modelkv_exporter.sidecar.collector import SpoolCollector
from modelkv_exporter.sidecar.labels import label
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.reader.state import EngineState
from modelkv_exporter.sidecar.source import SpoolSource
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.snapshots import ended, make_declaration, make_observation, make_snapshot
from tests.support.discovered import discovery_status, kv_layout, make_discovered


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def scrape(collector: SpoolCollector) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in Exposition(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def values(metrics: dict, name: str, **match: str) -> list[float]:
    return [v for labels, v in metrics.get(name, {}).items() if all(dict(labels).get(k) == m for k, m in match.items())]


def test_every_emitted_family_is_in_the_catalogue_with_its_labels(spool: Path) -> None:
    every = {m.source: 1 for m in MEASUREMENTS}
    full = make_snapshot(
        "e",
        interval=5.0,
        measured=every,
        baseline=every,
        architecture="A",
        stage_name="talker",
        tp_rank=0,
        observations=(make_observation("decoder"),),
    )
    dropped = (DroppedDeclaration("talker", "Talker", "declarer_raised", 1, "RuntimeError: boom"),)
    full = replace(
        full,
        settings=EngineSettings(8, 0.9, 100, 10, 400, 40, torch_headroom_bytes=64),
        sleep=SleepState(level=1, released={"weights": 10}),
        dropped_declarations=dropped,
        discovered=(make_discovered(layout=kv_layout()),),
        discovery=discovery_status(budget_exhausted="objects"),
    )
    write_snapshot(spool, full)
    gib = 1024**3
    host = {"process_resident": 3 * gib, "paged_kv_committed": gib}
    prescribed = replace(
        make_snapshot("prescribed", declarations=(), measured=host, baseline=host),
        settings=EngineSettings(
            8,
            paged_kv_bytes=gib,
            paged_kv_reserved_bytes=2 * gib,
            runtime_bytes=gib // 4,
            weights_bytes=gib // 4,
            torch_headroom_bytes=64,
            requested_memory_bytes=8 * gib,
        ),
    )  # awake, every part measured, a requested memory and an extensible KV cache: both prescribed figures
    write_snapshot(spool, prescribed)
    write_snapshot(spool, ended(replace(full, engine=replace(full.engine, engine_id="dead")), reserved_free_bytes=5))
    (spool / "broken.json").write_text("{")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpoolCollector(SpoolSource(SpoolReader(spool)), refusals={}))
    families = list(Exposition(generate_latest(registry).decode()))
    emitted = set()
    for family in families:
        name = family.name + ("_total" if family.type == "counter" else "_info" if family.type == "info" else "")
        if family.type == "gauge" and family.name.endswith("_info"):
            name = family.name
        metric = CATALOGUE.get(name) or CATALOGUE.get(family.name + "_info")
        assert metric is not None, family.name
        emitted.add(metric.name)
        for sample in family.samples:
            assert set(sample.labels) == set(metric.labels), (metric.name, sample.labels)
    assert emitted == set(CATALOGUE), set(CATALOGUE) - emitted
    assert all(len(m.labels) <= (MAX_INFO_LABELS if m.kind == "info" else MAX_LABELS) for m in CATALOGUE.values())


def test_declared_values_and_engine_figures(spool: Path) -> None:
    per_seq = make_declaration("req", max_num_seqs=8)
    fixed = make_declaration("pool", rows="fixed", rows_fixed=7, scope="model", max_num_seqs=8)
    write_snapshot(spool, make_snapshot("e", declarations=(per_seq, fixed), stage_id=2))
    m = scrape(SpoolCollector(SpoolSource(SpoolReader(spool))))
    assert values(m, "modelkv_declared_peak_bytes", cache="req", rows="max_num_seqs", scope="request", stage="2") == [
        per_seq.bytes_per_row * 8
    ]
    assert values(m, "modelkv_declared_peak_bytes", cache="pool", rows="fixed", scope="model") == [
        fixed.bytes_per_row * 7
    ]
    assert values(m, "modelkv_declared_rows", cache="pool") == [7]
    assert values(m, "modelkv_declared_capacity_positions", cache="req") == [71]
    assert values(m, "modelkv_engine_declared_per_sequence_bytes", engine="e") == [per_seq.bytes_per_row]
    assert values(m, "modelkv_engine_declarations", engine="e") == [2]
    assert values(m, "modelkv_declaration_info", cache="pool", geometry="8x16x64", dtype="float32") == [1]


def test_declaration_info_carries_the_model_and_stage_of_its_value_series(spool: Path) -> None:
    """Selecting declarations by model or stage works on the info series as on the values it annotates."""
    write_snapshot(spool, make_snapshot("t0", served_model_name="qwen3-tts", stage_name="talker"))
    write_snapshot(spool, make_snapshot("c1", served_model_name="qwen3-tts", stage_id=1))
    m = scrape(SpoolCollector(SpoolSource(SpoolReader(spool))))
    identity = ("engine", "model", "stage", "owner", "cache")
    peaks = {tuple(dict(k)[n] for n in identity) for k in m["modelkv_declared_peak_bytes"]}
    infos = {tuple(dict(k)[n] for n in identity) for k in m["modelkv_declaration_info"]}
    assert (
        infos
        == peaks
        == {("t0", "qwen3-tts", "talker", "decoder", "cache"), ("c1", "qwen3-tts", "1", "decoder", "cache")}
    )
    assert values(m, "modelkv_declaration_info", model="qwen3-tts", stage="talker", engine="t0") == [1]


def test_unmeasured_figures_are_absent_with_availability_zero(spool: Path) -> None:
    write_snapshot(spool, make_snapshot("e", measured={"process_resident": 0}, baseline={}))
    m = scrape(SpoolCollector(SpoolSource(SpoolReader(spool))))
    assert values(m, "modelkv_memory_process_resident_bytes") == [0], "a measured zero is a real zero"
    assert "modelkv_memory_torch_allocated_bytes" not in m
    assert "modelkv_memory_process_resident_baseline_bytes" not in m
    available = {dict(k)["source"]: v for k, v in m["modelkv_memory_measurement_available"].items()}
    assert available == {ms.source: (1.0 if ms.source == "process_resident" else 0.0) for ms in MEASUREMENTS}
    assert "modelkv_engine_paged_kv_bytes" not in m and "modelkv_engine_gpu_memory_utilization_ratio" not in m


def test_owners_that_vanish_stop_being_exported(spool: Path) -> None:
    collector = SpoolCollector(SpoolSource(SpoolReader(spool)))
    write_snapshot(spool, make_snapshot("e", declarations=(make_declaration("a"), make_declaration("b"))))
    assert len(values(scrape(collector), "modelkv_declared_peak_bytes")) == 2
    write_snapshot(spool, make_snapshot("e", declarations=(make_declaration("b"),)))
    assert [dict(k)["cache"] for k in scrape(collector)["modelkv_declared_peak_bytes"]] == ["b"]
    (spool / "e.json").unlink()
    m = scrape(collector)
    assert "modelkv_declared_peak_bytes" not in m and "modelkv_engine_up" not in m


def test_stale_engines_keep_identity_only_and_ended_engines_vanish(spool: Path) -> None:
    clock = Clock()
    collector = SpoolCollector(SpoolSource(SpoolReader(spool), stale_after=30, clock=clock))
    publisher = SnapshotPublisher(
        spool, make_snapshot("live", measured={"process_resident": 5}, heartbeat_at=clock.now)
    )
    publisher.start_heartbeat(5.0)
    publisher.stop()
    publisher.write()
    write_snapshot(spool, make_snapshot("oneshot", heartbeat_at=clock.now - 10_000))

    clock.now += 29
    m = scrape(collector)
    assert values(m, "modelkv_engine_up", engine="live") == [1] and values(
        m, "modelkv_engine_up", engine="oneshot"
    ) == [1]
    clock.now += 2
    m = scrape(collector)
    assert values(m, "modelkv_engine_up", engine="live") == [0]
    assert values(m, "modelkv_engine_snapshot_age_seconds", engine="live")[0] > 30
    assert values(m, "modelkv_declared_peak_bytes", engine="live") == []
    assert values(m, "modelkv_memory_process_resident_bytes", engine="live") == []
    assert values(m, "modelkv_engine_info", engine="live") == [1]
    assert values(m, "modelkv_exporter_spool_files", state="stale") == [1]

    publisher.end()
    clock.now = time.time()
    m = scrape(collector)
    assert values(m, "modelkv_engine_up", engine="live") == []
    assert values(m, "modelkv_exporter_spool_files", state="ended") == [1]


def test_long_slow_heartbeats_are_not_called_stale_early(spool: Path) -> None:
    clock = Clock()
    write_snapshot(spool, make_snapshot("slow", interval=60.0, heartbeat_at=clock.now))
    clock.now += 150
    m = scrape(SpoolCollector(SpoolSource(SpoolReader(spool), stale_after=30, clock=clock)))
    assert values(m, "modelkv_engine_up", engine="slow") == [1]


def test_hostile_label_text_is_escaped_bounded_and_parseable(spool: Path) -> None:
    nasty = 'quote " backslash \\ newline \n tab \t bell \x07 ünïcödé 漢字 ' + "x" * 500
    decl = make_declaration('cache "x"\n', owner="a\\b", capacity_source=nasty)
    write_snapshot(
        spool, make_snapshot('eng "1"\n', declarations=(decl,), served_model_name=nasty, stage_name="\u2028")
    )
    m = scrape(SpoolCollector(SpoolSource(SpoolReader(spool))))
    (info_labels,) = m["modelkv_declaration_info"]
    info = dict(info_labels)
    assert info["cache"] == 'cache "x" ' and info["owner"] == "a\\b"
    assert len(info["capacity_source"]) == 128 and re.search("…[0-9a-f]{8}$", info["capacity_source"])
    assert "\n" not in info["capacity_source"] and "\x07" not in info["capacity_source"]
    assert "ünïcödé 漢字" in info["capacity_source"]
    assert label("\ud800") == " "


def test_a_missing_spool_is_a_failed_scan_not_a_failed_scrape(tmp_path: Path) -> None:
    m = scrape(SpoolCollector(SpoolSource(SpoolReader(tmp_path / "absent"))))
    assert values(m, "modelkv_exporter_spool_scan_success") == [0]
    assert values(m, "modelkv_exporter_build_info") == [1]


def test_long_stale_and_long_ended_files_are_forgotten_and_counted(spool: Path) -> None:
    clock = Clock()
    collector = SpoolCollector(SpoolSource(SpoolReader(spool), stale_after=30, clock=clock, forget_after=3600))
    write_snapshot(spool, make_snapshot("renamed", heartbeat_at=clock.now, interval=5.0))
    write_snapshot(spool, replace(make_snapshot("done", heartbeat_at=clock.now, interval=5.0), ended=True))
    write_snapshot(spool, make_snapshot("oneshot", heartbeat_at=clock.now - 100_000))
    clock.now += 3600
    m = scrape(collector)
    assert values(m, "modelkv_engine_up", engine="renamed") == [0], "stale for an hour: still reported"
    assert values(m, "modelkv_exporter_spool_files", state="forgotten") == [0]
    clock.now += 1
    m = scrape(collector)
    assert (
        values(m, "modelkv_engine_up", engine="renamed") == []
        and values(m, "modelkv_engine_info", engine="renamed") == []
    )
    assert values(m, "modelkv_exporter_spool_files", state="forgotten") == [2]
    assert values(m, "modelkv_exporter_spool_files", state="stale") == [0]
    assert values(m, "modelkv_exporter_spool_files", state="ended") == [0]
    assert values(m, "modelkv_engine_up", engine="oneshot") == [1], "a one-shot snapshot is never stale nor forgotten"
    write_snapshot(spool, make_snapshot("renamed", heartbeat_at=clock.now, interval=5.0))
    assert values(scrape(collector), "modelkv_engine_up", engine="renamed") == [1], "a file that beats again returns"
    never = SpoolCollector(SpoolSource(SpoolReader(spool), stale_after=30, clock=clock, forget_after=0))
    clock.now += 10**6
    assert values(scrape(never), "modelkv_exporter_spool_files", state="forgotten") == [0], "0 never forgets"


def test_dropped_declarations_are_exported_per_owner_and_in_total(spool: Path) -> None:
    dropped = (
        DroppedDeclaration("talker", "Talker", "declarer_raised", 1, "RuntimeError: boom"),
        DroppedDeclaration("", "Root", "unresolvable_spec", 2),
        DroppedDeclaration("", "Root", "unresolvable_spec", 1),
    )
    write_snapshot(spool, replace(make_snapshot("e"), dropped_declarations=dropped))
    write_snapshot(spool, replace(make_snapshot("clean"), dropped_declarations=()))
    write_snapshot(spool, make_snapshot("older"))
    m = scrape(SpoolCollector(SpoolSource(SpoolReader(spool))))
    assert values(m, "modelkv_engine_declarations_dropped", engine="e") == [4]
    assert values(m, "modelkv_engine_declarations_dropped", engine="clean") == [0]
    assert values(m, "modelkv_engine_declarations_dropped", engine="older") == [], "unreported is absent, not 0"
    assert values(m, "modelkv_declarations_dropped", engine="e", owner="talker", reason="declarer_raised") == [1]
    assert values(m, "modelkv_declarations_dropped", engine="e", owner="(root)", reason="unresolvable_spec") == [3]


def test_a_reused_classification_ends_at_the_first_forget_deadline(spool: Path) -> None:
    """The source reuses its classification while the spool is unchanged: a file must still be forgotten on time."""
    clock = Clock()
    write_snapshot(spool, make_snapshot("old-id", heartbeat_at=clock.now, interval=5.0))
    reader = SpoolReader(spool, monotonic=lambda: 0.0, wall_ns=lambda: int(clock.now * 1e9) + 10**12)
    source = SpoolSource(reader, stale_after=30, clock=clock, forget_after=600)
    clock.now += 31
    first = source.view()
    assert first.counts[EngineState.STALE] == 1 and first.until == pytest.approx(
        first.entries[0].snapshot.heartbeat_at + 600
    )
    clock.now += 500
    assert source.view().scan is first.scan, "the same scan: the classification is reused"
    clock.now += 100
    assert source.view().counts[EngineState.FORGOTTEN] == 1
