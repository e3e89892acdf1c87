"""`plan` on what a finished run leaves: real demo engines publish, are observed, and end; then they are planned.

Three of the demo's engines run in their own processes exactly as the demo runs them (the real
owners, transformers caches, observer, discovery and publisher): Qwen3-TTS's code2wav stage, whose
decoder holds what it declares, its eager variant, whose decoder holds 1.5x its declaration on
purpose, and MiniCPM-o's streaming variant, whose module holds a cache nobody declares. All are
stopped before ``plan`` runs, so every snapshot is marked ended.
"""

from __future__ import annotations

import math
import multiprocessing
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from modelkv_exporter.cli.command_line import cli_command
from modelkv_exporter.contract.sizes import human_bytes
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.demo.engines import DEMO_ENGINES, UNDECLARED, UNDER_DECLARING, run_engine
from modelkv_exporter.sidecar.capacity import Demand
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_testbed.polling import eventually
from tests.cli.test_reports import pasted

ACCURATE = "qwen3-tts-s1-r0"
OWNER = "tokenizer.decoder"
GiB = 2**30


def _snapshots(spool: Path) -> dict[str, Snapshot]:
    return {snapshot.engine.engine_id: snapshot for _, snapshot in SpoolReader(spool).scan().snapshots}


def _observed(spool: Path) -> bool:
    found = _snapshots(spool)
    return (
        all(
            any(o.owner == OWNER and o.peak_bytes for o in found[engine].observations) if engine in found else False
            for engine in (ACCURATE, UNDER_DECLARING)
        )
        and UNDECLARED in found
        and bool(found[UNDECLARED].discovered)
    )


@pytest.fixture(scope="module")
def ended_spool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A spool the three engines wrote, observed and discovered their caches in, and marked ended when stopped."""
    spool = tmp_path_factory.mktemp("ended") / "spool"
    spool.mkdir()
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    processes = [
        context.Process(target=run_engine, args=(engine, str(spool), 0.0, stop), daemon=True)
        for engine in DEMO_ENGINES
        if engine.engine_id in (ACCURATE, UNDER_DECLARING, UNDECLARED)
    ]
    for process in processes:
        process.start()
    try:
        eventually(lambda: _observed(spool), "both engines' observed caches", timeout=180)
    finally:
        stop.set()
        for process in processes:
            process.join(60)
    assert all(snapshot.ended for snapshot in _snapshots(spool).values())
    yield spool


def plan(*argv: str) -> subprocess.CompletedProcess[str]:
    """The real command in a clean environment (no terminal: the report is at most 120 columns)."""
    return subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", "plan", *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )


def _row(stdout: str, engine: str) -> list[str]:
    (row,) = [line.split() for line in stdout.splitlines() if line.startswith(engine + " ")]
    return row


def test_a_finished_run_is_planned_and_its_engines_said_to_have_ended(ended_spool: Path) -> None:
    result = plan(str(ended_spool), "--max-num-seqs", "64")
    assert result.returncode == 0, result.stderr
    assert "no live engines" not in result.stdout
    for engine in (ACCURATE, UNDER_DECLARING):
        assert _row(result.stdout, engine)[1:3] == ["code2wav", "ended"]
    assert "ended: the engine shut down or died; planned from the snapshot it left" in result.stdout


def test_a_cache_memory_alone_answers_how_many_sequences_fit_per_engine(ended_spool: Path) -> None:
    result = plan(str(ended_spool), "--cache-memory", "2GiB")
    assert result.returncode == 0, result.stderr
    assert (
        "cache memory: 2147483648 bytes (2.0 GiB); fits: the largest max_num_seqs whose peak fits in" in result.stdout
    )
    assert "fits 2.0 GiB" in result.stdout and "peak at" not in result.stdout
    accurate = Demand.declared(_snapshots(ended_spool)[ACCURATE])
    assert _row(result.stdout, ACCURATE)[-1] == str((2 * GiB - accurate.fixed_bytes) // accurate.per_sequence_bytes)


def test_an_owner_observed_above_its_declaration_is_planned_from_what_it_held_with_a_warning(
    ended_spool: Path,
) -> None:
    """The eager decoder declares 8.9 MiB per sequence and holds 1.5x that: 2 GiB fits 153 sequences, not 230."""
    snapshot = _snapshots(ended_spool)[UNDER_DECLARING]
    declared = snapshot.per_sequence_bytes
    assert [d.rows for d in snapshot.declarations] == ["max_num_seqs", "max_num_seqs"], "nothing fixed"
    assert 2 * GiB // declared == 230, "what the declaration alone answers"
    expected = math.floor(2 * GiB / (declared * 1.5))
    assert expected == 153

    result = plan(str(ended_spool), "--cache-memory", "2GiB", "--max-num-seqs", "64")
    assert result.returncode == 0, result.stderr
    row = _row(result.stdout, UNDER_DECLARING)
    assert row[-1] == str(expected)
    assert row[-2] == "observed"
    assert human_bytes(declared * 3 * 64 // 2) == " ".join(row[6:8]), "the peak at 64 sequences, scaled"
    text = pasted(result.stdout)
    assert (
        f"warning: {UNDER_DECLARING}: under-reports: {OWNER} holds 1.50× its declaration "
        f"({human_bytes(declared * 6)} observed, {human_bytes(declared * 4)} declared) at max_num_seqs 4; its figures "
        "are scaled up by 1.50"
    ) in text
    assert f"what to declare instead: {cli_command()} check {ended_spool}" in text
    assert _row(result.stdout, ACCURATE)[-2] == "declared", "an owner holding what it declares is taken at its word"
    assert f"warning: {ACCURATE}" not in text


def test_without_its_observations_the_same_spool_plans_from_the_declaration(ended_spool: Path, spool: Path) -> None:
    """The scaling comes from the observation alone: the same snapshot without it answers the declared 230."""
    snapshot = _snapshots(ended_spool)[UNDER_DECLARING]
    write_snapshot(spool, replace(snapshot, observations=()))
    result = plan(str(spool), "--cache-memory", "2GiB")
    assert result.returncode == 0, result.stderr
    assert _row(result.stdout, UNDER_DECLARING)[-2:] == ["declared", "230"]
    assert "warning" not in result.stdout


def test_stale_and_rejected_files_are_named_beside_the_plan(spool: Path) -> None:
    golden = Path(__file__).parents[1] / "sidecar" / "golden"
    for source in ("rejected", "states"):
        result = plan(str(golden / source), "--max-num-seqs", "8", "--forget-after", "0")
        assert result.returncode == 0, result.stderr
        if source == "rejected":
            assert "rejected files:" in result.stdout
            assert "broken.json: invalid_json" in result.stdout
            assert "newer.json: unsupported_version" in result.stdout
        else:
            stale, ended = _row(result.stdout, "stale"), _row(result.stdout, "ended")
            assert stale[:2] == ["stale", "stale"] and ended[:2] == ["ended", "ended"], "no stage: id, then state"
            assert "stale: the engine missed its heartbeats; planned from its last snapshot" in result.stdout
    empty = plan(str(spool), "--cache-memory", "1GiB").stdout
    assert empty.endswith("fits in --cache-memory\nno engine snapshots in the spool\n")


def test_plan_needs_a_max_num_seqs_or_a_cache_memory(spool: Path) -> None:
    result = plan(str(spool))
    assert result.returncode == 2
    assert "modelkv-exporter plan: error: --max-num-seqs, --cache-memory or both are needed" in result.stderr
    usage = " ".join(result.stderr.split())
    assert "[--max-num-seqs MAX_NUM_SEQS] [--cache-memory CACHE_MEMORY]" in usage, "both optional, as the usage says"


def test_a_cache_nobody_declares_is_counted_with_a_warning(ended_spool: Path, spool: Path) -> None:
    """MiniCPM-o's streaming engine declares nothing and holds 70.3 MiB in a module discovery found: it plans at
    70.3 MiB, fixed, so 1 MiB of cache memory fits no sequence, and a warning names the module in the landing page's
    words. The same snapshot without its discovered owner plans as 0 B that any cache memory fits: the count comes
    from the discovered cache alone."""
    snapshot = _snapshots(ended_spool)[UNDECLARED]
    (found,) = snapshot.discovered
    assert not snapshot.declarations and found.peak_bytes > 64 << 20
    held = human_bytes(found.peak_bytes)

    result = plan(str(ended_spool), "--cache-memory", "1MiB", "--max-num-seqs", "64")
    assert result.returncode == 0, result.stderr
    row = _row(result.stdout, UNDECLARED)
    assert " ".join(row[4:6]) == " ".join(row[6:8]) == held, "the peak now and at 64 sequences"
    assert " ".join(row).endswith(f"observed none: fixed {held}")
    text = " ".join(result.stdout.split())
    assert (
        f"warning: {UNDECLARED}: undeclared cache: {found.owner} (StreamingAudioKVCache) holds {held} it does not "
        "declare; counted as fixed bytes"
    ) in text

    write_snapshot(spool, replace(snapshot, discovered=()))
    without = plan(str(spool), "--cache-memory", "1MiB")
    assert " ".join(_row(without.stdout, UNDECLARED)[4:]) == "0 B 0 B declared any (fixed only)"
    assert "warning" not in without.stdout
