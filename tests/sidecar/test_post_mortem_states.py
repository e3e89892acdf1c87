"""An engine that died stays visible with its last figures: ended with a reason, or vanished (killed, its liveness
lock held by no process), told apart from a clean shutdown and from a hung engine; /metrics exports its end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.collector import SpoolCollector
from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.growth import grown_parts, growth
from modelkv_exporter.sidecar.post_mortem import post_mortem
from modelkv_exporter.sidecar.reader import state as state_module
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.reader.state import EngineState
from modelkv_exporter.sidecar.source import SpoolSource
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.snapshots import ended, make_observation, make_snapshot

NOW = 1_800_000_000.0
GIB = 1 << 30
MIB = 1 << 20
BASE = {"torch_allocated": 10 * GIB, "torch_reserved": 11 * GIB, "process_gpu": 12 * GIB}
LEAKED = {"torch_allocated": 16 * GIB, "torch_reserved": 17 * GIB, "process_gpu": 18 * GIB + 256 * MIB}


def leaking(engine_id: str, heartbeat_at: float = NOW, interval: float | None = 5.0) -> Snapshot:
    """A device engine whose live tensors grew 6 GiB since its baseline and memory outside torch 256 MiB."""
    return make_snapshot(
        engine_id,
        heartbeat_at=heartbeat_at,
        interval=interval,
        measured=dict(LEAKED),
        baseline=dict(BASE),
        declarations=(),
    )


def scraped(source: SpoolSource) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpoolCollector(source))
    collected = generate_latest(registry).decode()
    cached = ExpositionCache(source, perf_counter=lambda: 0.0).render(openmetrics=False, compress=False).data.decode()
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for text in (collected, cached):
        samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for family in Exposition(text):
            for sample in family.samples:
                if sample.name != "modelkv_exporter_collect_duration_seconds":
                    samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        assert not found or samples == found, "the cache and the collector disagree"
        found = samples
    return found


def of(samples: dict, name: str, engine: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for labels, v in samples.get(name, {}).items() if dict(labels)["engine"] == engine}


def test_grown_parts_do_not_overlap_and_add_up_to_the_unplanned_growth() -> None:
    judged = growth(leaking("e"))
    assert judged is not None
    parts = grown_parts(judged)
    assert parts == {"model_local_caches": 0, "live_tensors": 6 * GIB, "non_torch": 256 * MIB}
    assert sum(parts.values()) == judged.unplanned
    observed = make_observation("decoder", peak_bytes=5 * GIB)
    with_cache = make_snapshot(
        "c", measured=dict(LEAKED), baseline=dict(BASE), observations=(observed,), declarations=()
    )
    judged = growth(with_cache)
    assert judged is not None
    parts = grown_parts(judged)
    assert parts == {"model_local_caches": 5 * GIB, "live_tensors": GIB, "non_torch": 256 * MIB}
    assert sum(parts.values()) == judged.unplanned


def test_an_engine_that_died_of_oom_exports_its_end_and_what_grew_and_nothing_live(spool: Path) -> None:
    segments = ((4 * GIB, 4 * GIB), (2 * GIB, GIB))
    write_snapshot(spool, ended(leaking("oom"), reserved_free_bytes=GIB, segments=segments))
    write_snapshot(spool, ended(leaking("clean"), "shutdown"))
    write_snapshot(spool, ended(leaking("failed"), "error"))
    write_snapshot(spool, leaking("alive"))
    source = SpoolSource(SpoolReader(spool), clock=lambda: NOW + 1)
    view = source.view()
    assert {i.snapshot.engine.engine_id: i.state for i in view.entries} == {
        "oom": EngineState.ENDED,
        "clean": EngineState.ENDED,
        "failed": EngineState.ENDED,
        "alive": EngineState.EXPORTED,
    }
    samples = scraped(source)
    ends = {dict(labels)["engine"]: (dict(labels)["reason"], v) for labels, v in
            samples["modelkv_engine_ended_timestamp_seconds"].items()}  # fmt: skip
    assert ends == {"oom": ("out_of_memory", NOW), "failed": ("error", NOW)}
    grown = {dict(labels)["part"]: v for labels, v in of(samples, "modelkv_engine_end_growth_bytes", "oom").items()}
    assert grown == {"model_local_caches": 0, "live_tensors": 6 * GIB, "non_torch": 256 * MIB}
    assert list(of(samples, "modelkv_engine_end_torch_reserved_free_bytes", "oom").values()) == [GIB]
    assert not of(samples, "modelkv_engine_end_torch_reserved_free_bytes", "failed")
    for dead in ("oom", "clean", "failed"):
        for name in ("modelkv_engine_up", "modelkv_engine_info", "modelkv_memory_torch_allocated_bytes",
                     "modelkv_engine_snapshot_age_seconds"):  # fmt: skip
            assert not of(samples, name, dead), (dead, name)
    assert not of(samples, "modelkv_engine_end_growth_bytes", "clean")
    assert of(samples, "modelkv_engine_up", "alive")
    dead = post_mortem(view.entries[[i.snapshot.engine.engine_id for i in view.entries].index("oom")].snapshot,
                       EngineState.ENDED)  # fmt: skip
    assert dead is not None and dead.largest_grown == ("live_tensors", 6 * GIB)
    assert "out_of_memory" in dead.headline() and "live_tensors grew 6.0 GiB" in dead.headline()


def test_a_died_engine_is_forgotten_like_any_ended_one(spool: Path) -> None:
    write_snapshot(spool, ended(leaking("oom")))
    source = SpoolSource(SpoolReader(spool), clock=lambda: NOW + 3601, forget_after=3600)
    assert [i.state for i in source.view().entries] == [EngineState.FORGOTTEN]
    assert "modelkv_engine_ended_timestamp_seconds" not in scraped(source)


@pytest.fixture
def holder(spool: Path) -> Iterator[subprocess.Popen[str]]:
    """A real process that holds engine ``v``'s liveness lock, as a publishing engine does."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from modelkv_exporter.contract.spool import hold_alive
        hold_alive({str(spool)!r}, "v")
        print("held", flush=True)
        time.sleep(120)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    yield process
    if process.poll() is None:
        process.kill()
    process.wait()


def test_a_killed_engine_is_vanished_a_hung_one_stale_and_asking_costs_one_flock_per_stale_file(
    spool: Path, holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Path] = []
    real = state_module.writer_alive

    def counting(path: Path) -> bool | None:
        asked.append(Path(path))
        return real(path)

    monkeypatch.setattr(state_module, "writer_alive", counting)
    write_snapshot(spool, leaking("v", heartbeat_at=NOW - 100))
    write_snapshot(spool, leaking("older", heartbeat_at=NOW - 100))
    write_snapshot(spool, leaking("fresh"))
    write_snapshot(spool, ended(leaking("gone")))
    settled = SpoolReader(spool, wall_ns=lambda: time.time_ns() + 10**12)
    source = SpoolSource(settled, clock=lambda: NOW + 1, stale_after=30)

    first = source.view()
    states = {i.snapshot.engine.engine_id: i.state for i in first.entries}
    assert states == {"v": EngineState.STALE, "older": EngineState.STALE, "fresh": EngineState.EXPORTED,
                      "gone": EngineState.ENDED}  # fmt: skip
    assert sorted(p.name for p in asked) == ["older.alive", "v.alive"]
    assert not of(scraped(source), "modelkv_engine_ended_timestamp_seconds", "v")

    holder.send_signal(signal.SIGKILL)
    holder.wait()
    asked.clear()
    view = source.view()
    assert view.scan is first.scan, "the spool did not change: the same scan, the classification reused but for this"
    states = {i.snapshot.engine.engine_id: i.state for i in view.entries}
    assert states["v"] is EngineState.VANISHED, "a killed engine whose file did not change must show at the next view"
    assert states["older"] is EngineState.STALE, "no liveness file (an older writer): cannot tell, stays stale"
    assert sorted(p.name for p in asked) == ["older.alive", "v.alive"]
    samples = scraped(source)
    assert list(of(samples, "modelkv_engine_ended_timestamp_seconds", "v").items()) == [
        ((("engine", "v"), ("model", "m"), ("reason", "vanished"), ("stage", "")), NOW - 100)
    ]
    assert list(of(samples, "modelkv_engine_up", "v").values()) == [0.0]
    assert of(samples, "modelkv_engine_end_growth_bytes", "v"), "a vanished engine keeps its last figures"
    assert not of(samples, "modelkv_engine_ended_timestamp_seconds", "older")
    assert view.counts[EngineState.VANISHED] == 1
