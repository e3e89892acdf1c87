"""``modelkv-exporter check``: the verdicts and a declaration to hand the model author, from a spool alone.

The spool holds the Qwen3-TTS decoder's real figures (docs/observed-caches.md: ICL, max_num_seqs 1),
a correct Ming talker, an x-vector decoder holding less than it declares, and a discovered owner.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from modelkv_exporter.cli.check_report import owner_verdicts
from modelkv_exporter.contract.snapshot import DiscoveredOwner, KVLayout
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.contract.vocabulary import RowDriver
from modelkv_exporter.judging.verdicts import VerdictKind
from modelkv_testbed.snapshots import make_declaration, make_observation, make_snapshot

POSITION = 2 * 8 * 16 * 64 * 4


def decoder(engine: str, observed: int, max_num_seqs: int = 1) -> object:
    declarations = tuple(
        make_declaration(name, owner="tokenizer.decoder", max_num_seqs=max_num_seqs)
        for name in ("codec_decoder_request", "codec_decoder_working_copy")
    )
    return make_snapshot(
        engine,
        declarations=declarations,
        max_num_seqs=max_num_seqs,
        observations=(make_observation("tokenizer.decoder", peak_bytes=observed, calls=6),),
    )


def run_check(spool: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", "check", str(spool)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )


def test_the_decoder_under_reports_and_its_resized_declaration_is_printed(spool: Path) -> None:
    write_snapshot(spool, decoder("qwen3-tts-code2wav", 310 * POSITION))
    result = run_check(spool)
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert "FAIL tokenizer.decoder (Owner): under-reports by 2.18x: declares 9,306,112 B, held 20,316,160 B" in out
    assert "physical_capacity_positions=310," in out and "rows=RowDriver.MAX_NUM_SEQS," in out
    assert (
        "# scope: not inferred: how long one allocation lives" in out and "from modelkv_exporter.protocol import" in out
    )
    assert "..." not in out.split("suggested declaration:")[1].split("evidence:")[0], (
        "no placeholder a spec would build"
    )
    assert "a running engine reports bytes, not the geometry" in out


def test_holding_less_from_a_running_engine_is_never_called_over_reporting(spool: Path) -> None:
    write_snapshot(spool, decoder("xvec", 97 * POSITION * 2, max_num_seqs=2))
    ming = make_declaration(
        "talker_llm_static_cache", owner="", layers=24, kv_heads=2, head_dim=64, positions=2048, element_size=2,
        rows=RowDriver.FIXED.value, max_num_seqs=4,
    )  # fmt: skip
    write_snapshot(
        spool,
        make_snapshot(
            "ming",
            declarations=(ming,),
            max_num_seqs=4,
            observations=(make_observation("", peak_bytes=ming.peak_bytes),),
        ),
    )
    result = run_check(spool)
    assert result.returncode == 0, result.stdout
    assert "ok   tokenizer.decoder (Owner): held 12,713,984 B of the 18,612,224 B it declares; bound not reached" in (
        result.stdout
    )
    assert "ok   (root) (Owner): holds what it declares (25,165,824 B)" in result.stdout


def test_a_discovered_owner_gets_a_declaration_from_its_layout() -> None:
    layout = KVLayout(layers=8, kv_heads=16, head_dim=64, dtype="float32", element_size=4, positions=168, rows=1)
    found = DiscoveredOwner("code2wav.decoder", "Decoder", "cache_layer", 310 * POSITION, 0, 0, layout=layout)
    snapshot = replace(make_snapshot("e", declarations=()), discovered=(found,))
    (item,) = owner_verdicts(snapshot)
    assert item.verdict.kind is VerdictKind.UNDECLARED and item.found_by == "cache_layer"
    assert item.figures is not None
    fields = {f.field: f for f in item.figures}
    assert fields["layers"].code == "8" and fields["dtype"].code == "torch.float32"
    assert not fields["physical_capacity_positions"].inferred
    assert "at least 310 a row" in fields["physical_capacity_positions"].evidence


def test_an_unobserved_owner_is_reported_as_such(spool: Path) -> None:
    snapshot = make_snapshot("off", observations=(make_observation("decoder", reason="observation is turned off"),))
    write_snapshot(spool, snapshot)
    result = run_check(spool)
    assert result.returncode == 1
    assert "FAIL decoder (Owner): not observed (observation is turned off)" in result.stdout


def test_an_unreadable_spool_says_so(tmp_path: Path) -> None:
    result = run_check(tmp_path / "missing")
    assert result.returncode == 1 and "cannot read the spool" in result.stderr


def test_control_characters_in_a_snapshot_are_printed_escaped(spool: Path) -> None:
    hostile = "decoder\x1b[2J\u202e"
    snapshot = make_snapshot(
        "hostile",
        declarations=(make_declaration(owner=hostile),),
        observations=(make_observation(hostile, peak_bytes=1 << 30),),
    )
    write_snapshot(spool, snapshot)
    result = run_check(spool)
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout
    assert "decoder\\x1b[2J\\u202e (Owner): under-reports" in result.stdout


def test_rejected_files_are_listed_with_their_reason_and_fail_the_check(spool: Path) -> None:
    write_snapshot(spool, decoder("good", 142 * POSITION))
    (spool / "broken.json").write_bytes(b"{not json")
    result = run_check(spool)
    assert result.returncode == 1, result.stdout
    assert "rejected files:" in result.stdout
    assert "FAIL broken.json: invalid_json:" in result.stdout
    assert "ok   tokenizer.decoder (Owner): holds what it declares" in result.stdout


def test_a_spool_whose_every_file_was_rejected_judged_nothing_and_fails(spool: Path) -> None:
    """Before: "no snapshots in the spool", exit status 0."""
    (spool / "a.json").write_bytes(b"[]")
    (spool / "b.json").write_bytes(b'{"schema_version": 1}')
    result = run_check(spool)
    assert result.returncode == 1, result.stdout
    assert "FAIL a.json: invalid_snapshot:" in result.stdout
    assert "FAIL b.json: invalid_snapshot:" in result.stdout
    assert "FAIL judged nothing: no snapshot in the spool could be read" in result.stdout


def test_an_empty_spool_judged_nothing_and_fails(spool: Path) -> None:
    result = run_check(spool)
    assert result.returncode == 1 and "FAIL judged nothing: no snapshots in the spool" in result.stdout
