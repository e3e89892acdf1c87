"""Capacity answers: the declared peak at any max_num_seqs, what fits in a cache memory, and the inspect/plan reports."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from modelkv_exporter.contract.sizes import parse_bytes
from modelkv_exporter.contract.snapshot import DroppedDeclaration, Observation
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.capacity import Correction, Demand
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_testbed.snapshots import make_declaration, make_observation, make_snapshot

GOLDEN = Path(__file__).parents[1] / "sidecar" / "golden"

PER_SEQ = make_declaration("req", max_num_seqs=8)  # 4,653,056 bytes per row
POOL = make_declaration("pool", rows="fixed", rows_fixed=7, scope="model", max_num_seqs=8)
SNAPSHOT = make_snapshot("code2wav", declarations=(PER_SEQ, POOL), stage_name="code2wav")
ROW = PER_SEQ.bytes_per_row


DECLARED = Demand.declared(SNAPSHOT)


def test_declared_peak_scales_only_per_sequence_caches() -> None:
    assert DECLARED.peak_at(8) == SNAPSHOT.declared_peak_bytes == ROW * 8 + ROW * 7
    assert DECLARED.peak_at(64) == ROW * 64 + ROW * 7
    assert DECLARED.peak_at(0) == ROW * 1 + ROW * 7, "at least one row"


@pytest.mark.parametrize(
    "cache_memory,expected",
    [(ROW * 7 - 1, 0), (ROW * 8 - 1, 0), (ROW * 8, 1), (ROW * 20 + 5, 13), (ROW * 1000, 993)],
)
def test_largest_max_num_seqs_that_fits(cache_memory: int, expected: int) -> None:
    fit = DECLARED.fit(cache_memory)
    assert fit.max_num_seqs == expected
    if expected:
        assert DECLARED.peak_at(expected) <= cache_memory < DECLARED.peak_at(expected + 1)


def test_an_owner_observed_above_its_declaration_has_each_of_its_caches_scaled_by_the_ratio() -> None:
    """Both of the owner's caches, per-sequence and fixed, grow by observed / declared; the fit follows."""
    held = SNAPSHOT.declared_peak_bytes * 3 // 2
    demand = Demand.expected(replace(SNAPSHOT, observations=(make_observation("decoder", peak_bytes=held),)))
    assert demand.corrections == (Correction("decoder", SNAPSHOT.declared_peak_bytes, held),)
    assert demand.corrections[0].ratio == Fraction(3, 2)
    assert (demand.per_sequence_bytes, demand.fixed_bytes) == (ROW * 3 // 2, ROW * 7 * 3 // 2)
    assert demand.peak_at(8) == held
    assert demand.fit(ROW * 30).max_num_seqs == 13 != DECLARED.fit(ROW * 30).max_num_seqs == 23


@pytest.mark.parametrize(
    "observation",
    [
        make_observation("decoder", peak_bytes=SNAPSHOT.declared_peak_bytes),
        make_observation("decoder", peak_bytes=1),
        make_observation("decoder", reason="the owner replayed a CUDA graph"),
    ],
)
def test_owners_holding_at_most_their_declaration_or_unobserved_are_taken_at_their_word(
    observation: Observation,
) -> None:
    snapshot = replace(SNAPSHOT, observations=(observation,))
    assert Demand.expected(snapshot) == DECLARED


def test_an_owner_holding_caches_it_does_not_declare_adds_them_as_fixed_bytes() -> None:
    snapshot = replace(SNAPSHOT, observations=(make_observation("vocoder", peak_bytes=ROW),))
    demand = Demand.expected(snapshot)
    assert demand.corrections == (Correction("vocoder", 0, ROW),) and demand.corrections[0].ratio is None
    assert (demand.fixed_bytes, demand.per_sequence_bytes) == (ROW * 8, ROW)


def test_the_golden_observed_spool_scales_only_the_decoder_by_its_2_18x() -> None:
    """The recorded Qwen3-TTS decoder: 155 MiB observed against 71 MiB declared; the unobservable talker stays."""
    ((_, snapshot),) = SpoolReader(GOLDEN / "observed").scan().snapshots
    demand = Demand.expected(snapshot)
    (correction,) = demand.corrections
    assert (correction.owner, correction.declared_bytes, correction.observed_bytes) == (
        "tokenizer.decoder",
        snapshot.declared_peak_of("tokenizer.decoder"),
        162529280,
    )
    assert f"{float(correction.ratio or 0):.2f}" == "2.18"
    talker = snapshot.declared_peak_of("talker")
    assert demand.fixed_bytes == talker and demand.peak_at(8) == talker + 162529280


def test_fixed_only_engines_fit_any_concurrency_or_none() -> None:
    fixed_only = make_snapshot("f", declarations=(POOL,))
    assert Demand.declared(fixed_only).fit(ROW * 7).max_num_seqs is None
    assert Demand.declared(fixed_only).fit(ROW * 6).max_num_seqs == 0


@pytest.mark.parametrize(
    "text,value",
    [("1073741824", 2**30), ("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30), ("1.5GB", 1_500_000_000), ("4 kB", 4000)],
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
                 "8 × 16 × 64 × 71", "sliding_window(72) - 1", "because", "35.5 MiB", "31.1 MiB", "(no declarations)",
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


def test_plan_answers_with_and_without_a_cache_memory(spool: Path) -> None:
    write_snapshot(spool, SNAPSHOT)
    result = cli("plan", "--spool-dir", str(spool), "--max-num-seqs", "64", "--cache-memory", f"{ROW * 20 + 5}")
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
    assert "stage 2, writer tests, max_num_seqs —\n" in inspected.stdout and "None" not in inspected.stdout
    planned = cli("plan", str(spool), "--max-num-seqs", "64", "--cache-memory", f"{ROW * 7}")
    assert planned.returncode == 0, planned.stderr
    (row,) = [line for line in planned.stdout.splitlines() if line.startswith("image")]
    assert row.split()[:4] == ["image", "2", "exported", "—"]
    assert row.count(f"{ROW * 7 / 2**20:.1f} MiB") == 2, "the peak now and at 64 sequences: the fixed part alone"
    assert row.endswith("any (fixed only)")
