"""The exposition cache over time: after any sequence of spool changes, it serves what a fresh rendering would.

A hypothesis state machine writes, rewrites and deletes snapshots, writes and rewrites bad
files, moves the clock (engines go stale) and marks engines ended, and renders in every format
with and without gzip after each step. Every cached body must equal, byte for byte, the body a
cache built from nothing renders at that moment, and carry the same samples as
prometheus_client renders for the reference collector. Mutants of the cache's keys must fail.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from prometheus_client import CollectorRegistry, generate_latest

from modelkv_exporter.contract.spool import snapshot_file_name, write_snapshot
from modelkv_exporter.sidecar.collector import SpoolCollector
from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.source import SpoolSource
from modelkv_testbed.snapshots import make_declaration, make_snapshot

START = 1_800_000_000.0
ENGINES = ("a", "b", "c")
BAD = (b"{", b"[]", b'{"schema_version": 99}', b"\xff\xfe", b'{"schema_version": 1}')
DURATION = "modelkv_exporter_collect_duration_seconds"


class FakeClocks:
    """Wall time for staleness, and a monotonic clock that always allows a full scan."""

    def __init__(self) -> None:
        self.now = START
        self.ticks = 0.0

    def wall(self) -> float:
        return self.now

    def wall_ns(self) -> int:
        return int(self.now * 1e9) + 10**12

    def monotonic(self) -> float:
        self.ticks += 10.0
        return self.ticks


def lines(text: str) -> set[str]:
    return {line for line in text.split("\n") if line and not line.startswith(("#", DURATION))}


class ExpositionStates(RuleBasedStateMachine):
    """The cache against a fresh cache and against prometheus_client, over random spool histories."""

    cache_class: type[ExpositionCache] = ExpositionCache

    @initialize()
    def start(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="modelkv-states-"))
        self.clocks = FakeClocks()
        reader = SpoolReader(self.directory, monotonic=self.clocks.monotonic, wall_ns=self.clocks.wall_ns)
        self.source = SpoolSource(reader, stale_after=30.0, clock=self.clocks.wall)
        self.cache = self.cache_class(self.source, perf_counter=lambda: 0.0)
        self.written: dict[str, float] = {}

    def teardown(self) -> None:
        shutil.rmtree(getattr(self, "directory", "/nonexistent"), ignore_errors=True)

    @rule(
        engine=st.sampled_from(ENGINES),
        declarations=st.integers(0, 3),
        max_num_seqs=st.integers(1, 4),
        memory=st.none() | st.integers(0, 3),
        beating=st.booleans(),
    )
    def write(self, engine: str, declarations: int, max_num_seqs: int, memory: int | None, beating: bool) -> None:
        snapshot = make_snapshot(
            engine,
            declarations=tuple(make_declaration(f"c{i}", max_num_seqs=max_num_seqs) for i in range(declarations)),
            max_num_seqs=max_num_seqs,
            heartbeat_at=self.clocks.now,
            interval=5.0 if beating else None,
            measured=None if memory is None else {"process_resident": memory},
            baseline=None if memory is None else {"process_resident": 1},
        )
        write_snapshot(self.directory, snapshot)
        self.written[engine] = self.clocks.now

    @rule(engine=st.sampled_from(ENGINES))
    def end(self, engine: str) -> None:
        snapshot = make_snapshot(engine, heartbeat_at=self.clocks.now, interval=5.0)
        write_snapshot(self.directory, replace(snapshot, ended=True))

    @rule(engine=st.sampled_from(ENGINES))
    def delete(self, engine: str) -> None:
        (self.directory / snapshot_file_name(engine)).unlink(missing_ok=True)

    @rule(name=st.sampled_from(("bad-1.json", "bad-2.json")), content=st.sampled_from(BAD))
    def write_bad(self, name: str, content: bytes) -> None:
        (self.directory / name).write_bytes(content)

    @rule(engine=st.sampled_from(ENGINES))
    def impersonate(self, engine: str) -> None:
        """Another file claims an engine's id: one of the two is rejected as a duplicate."""
        snapshot = make_snapshot(engine, heartbeat_at=self.clocks.now - 1, interval=5.0)
        (self.directory / f"impostor-{engine}.json").write_bytes(snapshot.to_json())

    @rule(seconds=st.sampled_from((1.0, 20.0, 40.0)))
    def move_clock(self, seconds: float) -> None:
        self.clocks.now += seconds

    @rule(openmetrics=st.booleans(), compress=st.booleans())
    def render(self, openmetrics: bool, compress: bool) -> None:
        body = self.cache.render(openmetrics=openmetrics, compress=compress)
        fresh = ExpositionCache(self.source, perf_counter=lambda: 0.0).render(
            openmetrics=openmetrics, compress=compress
        )
        cached_data, fresh_data = body.data, fresh.data
        if compress:
            cached_data, fresh_data = gzip.decompress(cached_data), gzip.decompress(fresh_data)
        assert cached_data == fresh_data
        assert body.content_type == fresh.content_type and body.gzipped == compress

    @invariant()
    def same_samples_as_prometheus_client(self) -> None:
        if not hasattr(self, "cache"):
            return
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SpoolCollector(self.source))
        reference = generate_latest(registry).decode()
        assert lines(self.cache.render(openmetrics=False, compress=False).data.decode()) == lines(reference)


SETTINGS = settings(max_examples=60, stateful_step_count=25, deadline=None, derandomize=True, database=None)


def test_the_cache_always_serves_a_fresh_rendering() -> None:
    run_state_machine_as_test(ExpositionStates, settings=SETTINGS)


class WithoutRejectionsInKey(ExpositionCache):
    """A mutant: the exporter block's key forgets the rejection counts."""

    def _exporter_key(self, view, openmetrics):  # type: ignore[no-untyped-def]
        key = super()._exporter_key(view, openmetrics)
        return key[:-1]


class WithoutVersionInKey(ExpositionCache):
    """A mutant: an engine is keyed by its file name alone, so a rewrite is never rendered again."""

    @staticmethod
    def _engine_key(entry, stale):  # type: ignore[no-untyped-def]
        return (entry.file_name, 0, stale)


@pytest.mark.parametrize("mutant", [WithoutRejectionsInKey, WithoutVersionInKey])
def test_the_state_machine_catches_a_cache_that_forgets_part_of_its_key(mutant: type[ExpositionCache]) -> None:
    machine = type(f"States{mutant.__name__}", (ExpositionStates,), {"cache_class": mutant})
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine, settings=SETTINGS)
