"""Capacity answers: the declared peak at any max_num_seqs, what fits a budget, and the inspect/plan reports."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from modelkv_exporter.cli.capacity import declared_peak_at, largest_fitting
from modelkv_exporter.contract.snapshot import DroppedDeclaration
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.sizes import parse_bytes
from tests.support.snapshots import make_declaration, make_snapshot

PER_SEQ = make_declaration("req", max_num_seqs=8)  # 4,653,056 bytes per row
POOL = make_declaration("pool", rows="fixed", rows_fixed=7, scope="model", max_num_seqs=8)
SNAPSHOT = make_snapshot("code2wav", declarations=(PER_SEQ, POOL), stage_name="code2wav")
ROW = PER_SEQ.bytes_per_row


def test_declared_peak_scales_only_per_sequence_caches() -> None:
    assert declared_peak_at(SNAPSHOT, 8) == SNAPSHOT.declared_peak_bytes == ROW * 8 + ROW * 7
    assert declared_peak_at(SNAPSHOT, 64) == ROW * 64 + ROW * 7
    assert declared_peak_at(SNAPSHOT, 0) == ROW * 1 + ROW * 7, "at least one row"


@pytest.mark.parametrize(
    "budget,expected",
    [(ROW * 7 - 1, 0), (ROW * 8 - 1, 0), (ROW * 8, 1), (ROW * 20 + 5, 13), (ROW * 1000, 993)],
)
def test_largest_max_num_seqs_that_fits(budget: int, expected: int) -> None:
    fit = largest_fitting(SNAPSHOT, budget)
    assert fit.max_num_seqs == expected
    if expected:
        assert declared_peak_at(SNAPSHOT, expected) <= budget < declared_peak_at(SNAPSHOT, expected + 1)


def test_fixed_only_engines_fit_any_concurrency_or_none() -> None:
    fixed_only = make_snapshot("f", declarations=(POOL,))
    assert largest_fitting(fixed_only, ROW * 7).max_num_seqs is None
    assert largest_fitting(fixed_only, ROW * 6).max_num_seqs == 0


@pytest.mark.parametrize(
    "text,value",
    [("1073741824", 2**30), ("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30), ("1.5G", 1_500_000_000), ("4 kb", 4000)],
)
def test_sizes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


def test_bad_sizes_are_errors() -> None:
    for text in ("", "lots", "-1GiB", "1PiB"):
        with pytest.raises(ValueError):
            parse_bytes(text)


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modelkv_exporter", *argv], capture_output=True, text=True)


def test_inspect_prints_every_field_and_every_rejection(spool: Path) -> None:
    write_snapshot(spool, SNAPSHOT)
    write_snapshot(spool, make_snapshot("plain-llm", declarations=()))
    (spool / "broken.json").write_text("{")
    result = cli("inspect", str(spool))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for text in ("engine code2wav [exported]", "stage code2wav", "req", "pool", "request", "model", "max_num_seqs",
                 "8x16x64x71", "sliding_window(72) - 1", "because", "35.5 MiB", "31.1 MiB", "(no declarations)",
                 "broken.json: invalid_json"):  # fmt: skip
        assert text in out, text


def test_inspect_shows_dropped_declarations_and_forgotten_engines(spool: Path) -> None:
    dropped = (DroppedDeclaration("talker.decoder", "TalkerDecoder", "declarer_raised", 1, "KeyError: 'heads'"),)
    write_snapshot(spool, replace(make_snapshot("broken-declarer"), dropped_declarations=dropped))
    write_snapshot(spool, make_snapshot("old-id", heartbeat_at=time.time() - 7200, interval=5.0))
    out = cli("inspect", str(spool)).stdout
    assert "dropped: 1 of talker.decoder (TalkerDecoder), declarer_raised: KeyError: 'heads'" in out
    assert "engine old-id [forgotten]" in out
    assert "engine old-id [stale]" in cli("inspect", "--forget-after", "0", str(spool)).stdout


def test_plan_answers_with_and_without_a_budget(spool: Path) -> None:
    write_snapshot(spool, SNAPSHOT)
    result = cli("plan", "--spool-dir", str(spool), "--max-num-seqs", "64", "--budget", f"{ROW * 20 + 5}")
    assert result.returncode == 0, result.stderr
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("code2wav")]
    assert row.split()[-1] == "13"
    assert f"{(64 + 7) * ROW / 2**20:.1f} MiB" in row, "peak at 64: 64 per-sequence rows and 7 fixed"
    plain = cli("plan", str(spool), "--max-num-seqs", "2").stdout
    assert "largest" not in plain and "code2wav" in plain
    assert cli("plan", str(spool)).returncode == 2
    assert "give DIR" in cli("inspect").stderr


def test_inspect_and_plan_say_when_an_engine_has_no_max_num_seqs(spool: Path) -> None:
    write_snapshot(spool, make_snapshot("image", declarations=(POOL,), max_num_seqs=None, stage_id=2))
    inspected = cli("inspect", str(spool))
    assert inspected.returncode == 0, inspected.stderr
    assert "stage 2, max_num_seqs none\n" in inspected.stdout and "None" not in inspected.stdout
    planned = cli("plan", str(spool), "--max-num-seqs", "64", "--budget", f"{ROW * 7}")
    assert planned.returncode == 0, planned.stderr
    (row,) = [line for line in planned.stdout.splitlines() if line.startswith("image")]
    assert row.split()[:3] == ["image", "2", "—"]
    assert row.count(f"{ROW * 7 / 2**20:.1f} MiB") == 2, "the peak now and at 64 sequences: the fixed part alone"
    assert row.endswith("any (nothing scales with it)")
