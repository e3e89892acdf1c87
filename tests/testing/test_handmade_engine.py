"""Issue 47 in a running engine: the snapshot, the sidecar's series and ``check SPOOL`` agree with the check.

On main (dec3b54) only ``modelkv_exporter.testing`` counted the plain tensors the census finds on a declaring owner
for that owner: a running engine published the plain-tensor ring's owner as "declared cache never used" (it holds no
cache layer) beside a discovered ``census`` owner of the same bytes, so ModelKVDeclaredCacheUnused and
ModelKVUndeclaredCache could fire for an exact declaration; and a writer of its parent's cache was marked in process
only, so ``check SPOOL`` passed its declaration ("held 0 B; bound not reached").
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from modelkv_exporter.cli.check_report import owner_verdicts
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.spool import snapshot_file_name
from modelkv_exporter.contract.vocabulary import DiscoveryMethod
from modelkv_exporter.engine.config import DiscoverySettings
from modelkv_exporter.engine.discover import Discovery
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.observe import install
from modelkv_exporter.engine.protocol import declaring_owners
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_exporter.judging.verdicts import VerdictKind
from modelkv_exporter.sidecar.attention import Concern, declaration_findings
from modelkv_exporter.sidecar.budget import Budget
from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.reader.scan import read_snapshot_file
from modelkv_exporter.sidecar.source import SpoolSource
from modelkv_exporter.testing import check
from modelkv_testbed.exposition import Exposition
from tests.testing.handmade import LONGEST, Doubling, PlainRing, declare, drive

MAX_NUM_SEQS = 4
ENGINE = "handmade"
RING_BYTES = 2 * 2 * MAX_NUM_SEQS * 3 * 6 * 8 * 4
"""Keys and values, ``LAYERS`` x ``[max_num_seqs, HEADS, WINDOW, HEAD_DIM]`` float32: the exact declaration's peak."""


@contextlib.contextmanager
def engine(model: torch.nn.Module, spool: Path) -> Iterator[Callable[[], Snapshot]]:
    """``model`` wired as the vLLM plugin wires a worker's (observer, discovery with every owner published,
    publisher); ``beat()`` runs a census, publishes one heartbeat and reads the snapshot back as the sidecar does."""
    snapshot = build_snapshot(model, max_num_seqs=MAX_NUM_SEQS, engine_id=ENGINE)
    observer = install(declaring_owners(model), enabled=True)
    declaring = {d.owner for d in snapshot.declarations}
    settings = DiscoverySettings(discover_floor_bytes=1)
    discovery = Discovery(model, settings, observer=observer, declaring=declaring)
    discovery.start()
    publisher = SnapshotPublisher(spool, snapshot)

    def beat() -> Snapshot:
        discovery.census()
        observations = observer.sample()
        publisher.beat(None, observations, discovery.sample(observations))
        return read_snapshot_file(spool / snapshot_file_name(ENGINE), 1 << 24)

    try:
        yield beat
    finally:
        discovery.uninstall()
        observer.uninstall()
        publisher.stop()


def run_engine(model: torch.nn.Module, spool: Path) -> Snapshot:
    with engine(model, spool) as beat:
        for size in (1, MAX_NUM_SEQS):
            drive(model, size)
        return beat()


def scrape(spool: Path) -> Exposition:
    source = SpoolSource.budgeted(spool, budget=Budget(), reading=None, clock=time.time)
    return Exposition(ExpositionCache(source).render(openmetrics=True, compress=False).data.decode(), openmetrics=True)


def judged(spool: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", "check", str(spool)], capture_output=True, text=True
    )


def test_a_running_engine_counts_the_plain_ring_for_the_owner_that_declares_it(tmp_path: Path) -> None:
    in_process = check(PlainRing([declare()], MAX_NUM_SEQS), drive, max_num_seqs=MAX_NUM_SEQS, batches=(1, 4))
    snapshot = run_engine(PlainRing([declare()], MAX_NUM_SEQS), tmp_path)
    (observation,) = snapshot.observations
    assert observation.available and observation.plain_bytes == RING_BYTES, observation
    assert observation.peak_bytes == observation.live_bytes == RING_BYTES
    assert observation.cache_calls is None, "which calls wrote the plain tensors is not seen: unknown, never 0"
    assert not [d for d in snapshot.discovered if d.owner == ""], "the census find is the owner's, published once"
    (verdict,) = owner_verdicts(snapshot)
    assert verdict.verdict == in_process.owner("").verdict and verdict.verdict.kind is VerdictKind.HOLDS
    concerns = {finding.concern for finding in declaration_findings(snapshot)}
    assert not concerns & {Concern.UNUSED, Concern.UNDECLARED}, concerns
    exposition = scrape(tmp_path)
    assert exposition.value("modelkv_observed_peak_bytes", engine=ENGINE) == RING_BYTES
    assert not exposition.all("modelkv_discovered_peak_bytes", engine=ENGINE)
    assert not exposition.all("modelkv_observed_calls_total", engine=ENGINE)
    result = judged(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ok   (root) (PlainRing): holds what it declares ({RING_BYTES:,} B)" in result.stdout, result.stdout


def test_undeclared_the_same_ring_is_discovered_with_the_same_bytes(tmp_path: Path) -> None:
    """One rule whether declared or not: undeclared, the ring is the owner's census find, as before."""
    snapshot = run_engine(PlainRing([], MAX_NUM_SEQS), tmp_path)
    (found,) = [d for d in snapshot.discovered if d.owner == ""]
    assert found.found_by == DiscoveryMethod.CENSUS.value and found.peak_bytes == RING_BYTES and not found.declares
    assert all(o.plain_bytes is None for o in snapshot.observations), "an owner declaring nothing is discovered"
    assert [v.verdict.kind for v in owner_verdicts(snapshot) if v.found_by] == [VerdictKind.UNDECLARED]


def test_a_short_declaration_of_the_ring_under_reports_in_the_spool_as_in_the_check(tmp_path: Path) -> None:
    short = [declare(physical_capacity_positions=5)]
    in_process = check(PlainRing(short, MAX_NUM_SEQS), drive, max_num_seqs=MAX_NUM_SEQS, batches=(1, 4))
    (verdict,) = owner_verdicts(run_engine(PlainRing(short, MAX_NUM_SEQS), tmp_path))
    assert verdict.verdict == in_process.owner("").verdict and verdict.verdict.kind is VerdictKind.UNDER_REPORTS


def test_writers_of_their_parents_cache_fail_in_the_spool_as_in_the_check(tmp_path: Path) -> None:
    """The holder mark is published (``held_by``): the spool's verdict is the check's."""

    def doubled() -> Doubling:
        return Doubling([declare(physical_capacity_positions=LONGEST)], MAX_NUM_SEQS, [declare(layers=1)])

    in_process = check(doubled(), drive, max_num_seqs=MAX_NUM_SEQS, batches=(1, 4))
    snapshot = run_engine(doubled(), tmp_path)
    by_owner = {o.owner: o for o in snapshot.observations}
    assert (by_owner["first"].held_by, by_owner["first"].held_by_class) == ("", "Doubling")
    assert by_owner[""].held_by is None
    verdicts = {v.owner: v.verdict for v in owner_verdicts(snapshot)}
    for writer in ("first", "second"):
        assert verdicts[writer] == in_process.owner(writer).verdict, (verdicts[writer], in_process.text())
        assert verdicts[writer].kind is VerdictKind.HELD_ELSEWHERE
    assert verdicts[""].kind is VerdictKind.HOLDS
    result = judged(tmp_path)
    assert result.returncode == 1
    assert "FAIL first (DeclaringWriter): declares a cache another module holds" in result.stdout, result.stdout


def test_without_the_attribution_the_engine_reports_the_ring_twice_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mechanism broken on purpose: the heartbeat publishes the census find beside the owner, as on main."""
    from modelkv_exporter.engine import heartbeat

    monkeypatch.setattr(heartbeat, "attribute_plain", lambda observations, discovered: (observations, discovered))
    snapshot = run_engine(PlainRing([declare()], MAX_NUM_SEQS), tmp_path)
    assert [d.owner for d in snapshot.discovered if d.found_by == DiscoveryMethod.CENSUS.value] == [""]
    (verdict, *_) = owner_verdicts(snapshot)
    assert verdict.verdict.kind is VerdictKind.UNUSED
