"""inspect and plan as a person reads them: states named as everywhere else, no line wider than 120 columns."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from modelkv_exporter.cli.command_line import cli_command
from modelkv_exporter.cli.reports import inspect_report
from modelkv_exporter.cli.text_layout import MAX_WIDTH, abbreviate, table
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.reader.state import EngineState, classify
from modelkv_testbed.snapshots import make_declaration, make_observation, make_snapshot
from tests.support.discovered import golden_discovered_spool, make_discovered

LONG_OWNER = "thinker.model.language_model.layers.27.self_attn.rotary_and_sliding_window_cache_owner"
LONG_SOURCE = "min(config.max_position_embeddings, config.sliding_window * config.num_hidden_layers) " * 4


def pasted(text: str) -> str:
    """``text`` as a shell reads it, in single spaces: a line ending in `` \\`` goes on with the next one."""
    return " ".join(re.sub(r" \\\n", " ", text).split())


def run_cli(*argv: str, columns: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", **({"COLUMNS": columns} if columns else {})}
    return subprocess.run([sys.executable, "-m", "modelkv_exporter", *argv], capture_output=True, text=True, env=env)


def _fill(spool: Path) -> None:
    now = time.time()
    write_snapshot(
        spool,
        make_snapshot(
            "qwen3-omni-thinker-s0-tp0-pp0-dp0-" + "x" * 90,
            declarations=(
                make_declaration("long_context_" * 6, owner=LONG_OWNER, capacity_source=LONG_SOURCE),
                make_declaration("pool", rows="fixed", rows_fixed=7, scope="model"),
            ),
            served_model_name="Qwen/Qwen3-Omni-30B-A3B-Instruct-with-a-very-long-served-model-name",
            stage_name="thinker",
        ),
    )
    write_snapshot(spool, make_snapshot("late", interval=1.0, heartbeat_at=now - 600))
    write_snapshot(spool, replace(make_snapshot("done"), ended=True))
    (spool / ("broken-" + "y" * 150 + ".json")).write_text("{")


def test_inspect_names_states_as_the_page_and_metrics_do(spool: Path) -> None:
    _fill(spool)
    out = run_cli("inspect", str(spool)).stdout
    assert "[exported]" in out and "[stale]" in out and "[ended]" in out
    assert "[live]" not in out
    view = classify(SpoolReader(spool).scan(), time.time(), 30.0, 0.0)
    assert {item.state for item in view.usable} == {EngineState.EXPORTED, EngineState.STALE, EngineState.ENDED}


def test_inspect_and_plan_fit_120_columns_and_keep_every_word(spool: Path) -> None:
    """Long names are cut in the table and given whole in the wrapped detail lines below it."""
    _fill(spool)
    for columns in (None, "300", "100"):
        out = run_cli("inspect", str(spool), columns=columns).stdout
        limit = MAX_WIDTH if columns is None else min(MAX_WIDTH, int(columns))
        widest = max(len(line) for line in out.splitlines())
        assert widest <= limit, f"COLUMNS={columns}: a line of {widest} columns"
        words = " ".join(out.split())
        unwrapped = "".join(out.split())
        assert LONG_OWNER in unwrapped and "".join(LONG_SOURCE.split()) in unwrapped
        assert "geometry: layers × kv_heads × head_dim × positions per row, then the element type" in words
        assert "8×16×64×71" in unwrapped and "Qwen/Qwen3-Omni-30B-A3B-Instruct" in unwrapped
        plan = run_cli("plan", str(spool), "--max-num-seqs", "64", "--cache-memory", "1GiB", columns=columns).stdout
        assert max(len(line) for line in plan.splitlines()) <= limit
        assert "fits 1.0 GiB" in plan


def test_the_width_limit_is_what_keeps_lines_short(spool: Path) -> None:
    """The same report without a width limit is far wider: the limit, not the data, keeps it at 120."""
    _fill(spool)
    view = classify(SpoolReader(spool).scan(), time.time(), 30.0, 0.0)
    assert max(len(line) for line in inspect_report(view, 120).splitlines()) <= 120
    assert max(len(line) for line in inspect_report(view, 10_000).splitlines()) > 200


SEPARATORS = "./_-: "


def _cut_where_a_part_ends(cell: str, whole: str) -> bool:
    """Whether ``cell`` is ``whole``'s head and tail around an ellipsis, each cut where a word or path part ends."""
    head, _, tail = cell.partition("…")
    return (
        whole.startswith(head)
        and whole.endswith(tail)
        and (not head or head[-1] in SEPARATORS)
        and (not tail or whole[len(whole) - len(tail) - 1] in SEPARATORS)
    )


def test_long_names_are_cut_where_a_part_ends_and_keep_their_tail() -> None:
    path = "thinker.model.language_model.layers.27.self_attn.rotary_and_sliding_window_cache_owner"
    assert abbreviate(path, 40) == "thinker.…and_sliding_window_cache_owner"
    assert abbreviate(path, 30) == "thinker.…window_cache_owner"
    assert abbreviate("qwen3-omni-thinker-s0-tp0-pp0-dp0", 20) == "qwen3-…tp0-pp0-dp0"
    for width in range(12, len(path)):
        cut = abbreviate(path, width)
        assert len(cut) <= width and _cut_where_a_part_ends(cut, path), (width, cut)
        assert cut.endswith("owner"), "the distinguishing tail of the module path stays"
    assert abbreviate("long_context_" * 3, 8) == "long_…", "no trailing part fits: the head alone"
    assert abbreviate("x" * 40, 9) == "xxxx…xxxx", "no place to cut: the middle"


def test_inspect_cuts_owner_and_cache_names_where_a_part_ends(spool: Path) -> None:
    _fill(spool)
    names = [LONG_OWNER, "long_context_" * 6, "decoder", "pool", "cache"]
    out = run_cli("inspect", str(spool), columns="80").stdout
    cut = [cell for line in out.splitlines() for cell in line.split("  ") if "…" in cell]
    assert cut, "the 80-column table cuts the long names"
    for cell in cut:
        assert any(_cut_where_a_part_ends(cell.strip(), name) for name in names), cell


def test_tables_cut_only_text_columns_in_the_middle() -> None:
    assert abbreviate("abcdefghij", 5) == "ab…ij" and abbreviate("short", 8) == "short"
    rows = [["x" * 100, "y" * 100, "1234567", "35.5 MiB"]]
    lines = table(["owner", "cache", "n", "peak"], rows, width=60, narrow=(0, 1)).splitlines()
    assert max(len(line) for line in lines) <= 60
    assert lines[2].endswith("1234567  35.5 MiB"), "numbers and sizes stay whole"
    assert "…" in lines[2]


def test_plan_without_a_cache_memory_has_no_fits_column(spool: Path) -> None:
    _fill(spool)
    plain = run_cli("plan", str(spool), "--max-num-seqs", "2").stdout
    assert "largest" not in plain and "qwen3-omni-thinker" in plain


def test_inspect_shows_each_owner_declared_beside_observed(spool: Path) -> None:
    declaration = make_declaration("kv", owner="talker")
    write_snapshot(
        spool,
        make_snapshot(
            "observed",
            declarations=(declaration,),
            observations=(
                make_observation("talker", peak_bytes=declaration.peak_bytes * 3, calls=9, cache_calls=4),
                make_observation("vocoder", reason="the owner replayed a CUDA graph", calls=2),
            ),
        ),
    )
    out = run_cli("inspect", str(spool)).stdout
    lines = [line.split() for line in out.splitlines()]
    assert ["talker", "35.5", "MiB", "106.5", "MiB", "106.5", "MiB", "106.5", "MiB", "4/9"] in lines
    assert ["vocoder", "0", "B", "—", "—", "—", "—"] in lines
    words = " ".join(out.split())
    assert "talker: holds 3.00× its declaration (106.5 MiB observed, 35.5 MiB declared)" in words
    assert "vocoder: not observed: the owner replayed a CUDA graph" in words


def test_inspect_lists_discovered_owners_and_what_to_declare(spool: Path) -> None:
    """The engine's discovered owners beside its declarations, what discovery covered, and for each owner that
    declares nothing the declaration its layout suggests; none of it for a writer that predates discovery, and
    the hostile path escaped, never raw in the terminal."""
    for name, data in golden_discovered_spool().items():
        (spool / name).write_bytes(data)
    out = run_cli("inspect", str(spool)).stdout
    assert max(len(line) for line in out.splitlines()) <= MAX_WIDTH
    engines = dict(re.findall(r"^engine (\S+) \[[a-z]+\].*?\n(.*?)(?=^engine |\Z)", out, re.S | re.M))
    assert set(engines) == {"qwen3-tts-eager", "minicpmo-audio", "older-writer"}
    assert "discover" not in engines["older-writer"]
    assert "discovery is off: turned off by MODELKV_OBSERVE=0" in engines["minicpmo-audio"]
    running = engines["qwen3-tts-eager"]
    (row,) = [line for line in running.splitlines() if line.startswith("tokenizer.decoder ")]
    assert row.split() == ["tokenizer.decoder", "cache_layer", "nothing", "18.0", "MiB", "18.0", "MiB", "18.0", "MiB",
                           "8", "×", "16", "×", "64", "×", "72", "float32,", "4", "rows"]  # fmt: skip
    words = " ".join(running.split())
    assert "the census ran out of its objects budget" in words and "3 owners below the engine's size floor" in words
    summary = pasted(out.split("\nengine ", 1)[0])
    assert (
        "undeclared cache: tokenizer.decoder (Qwen3TTSTokenizerV2Decoder) holds 18.0 MiB it does not declare"
    ) in summary
    assert f"run: {cli_command()} check {spool} (each owner's verdict" in summary
    checked = run_cli("check", str(spool)).stdout
    assert "layers=8" in checked and "kv_heads=16" in checked and "head_dim=64" in checked, checked
    assert "\u202e" not in out and "\x00" not in out and "blocks.0\\n.attn\\u202e" in "".join(out.split())


def test_inspect_opens_with_a_summary_of_the_problems_and_what_to_do(spool: Path) -> None:
    """Two engines with problems among healthy ones: before any table, one line each with the landing page's words,
    then the fix, the command and the runbook section; the healthy engines are only counted. An ended engine is
    judged on what it left: a finished run is worth reading."""
    declared = make_declaration("kv", owner="tokenizer.decoder")
    over = make_observation("tokenizer.decoder", peak_bytes=declared.peak_bytes * 3 // 2)
    write_snapshot(spool, make_snapshot("eager-s1", declarations=(declared,), observations=(over,)))
    write_snapshot(spool, replace(make_snapshot("streaming-s0", declarations=()), ended=True,
                                  discovered=(make_discovered("apm.streaming_kv", found_by="census",
                                                              owner_class="StreamingAudioKVCache"),)))  # fmt: skip
    for healthy in ("a-s0", "b-s0", "c-s0"):
        write_snapshot(spool, make_snapshot(healthy))
    out = run_cli("inspect", str(spool)).stdout
    head, _, rest = out.partition("\nengine ")
    assert rest and "declared peak" not in head and "[exported]" not in head, "the summary comes before the tables"
    lines = head.splitlines()
    assert lines[0] == "summary: 5 engines, 2 with problems:"
    words = pasted(head)
    assert (
        "eager-s1 (m, exported): under-reports: tokenizer.decoder holds 1.50× its declaration (53.2 MiB observed, "
        "35.5 MiB declared) fix: declare what the owner's caches hold"
    ) in words
    assert (
        "streaming-s0 (m, ended): undeclared cache: apm.streaming_kv (StreamingAudioKVCache) holds 1.0 MiB it does "
        "not declare fix: declare the cache"
    ) in words
    assert words.count(f"run: {cli_command()} check {spool}") == 2
    assert "runbook: ModelKVDeclarationUnderReports, docs/runbook.md#modelkvdeclarationunderreports" in words
    assert "runbook: ModelKVUndeclaredCache, docs/runbook.md#modelkvundeclaredcache" in words
    assert not any(name in head for name in ("a-s0", "b-s0", "c-s0"))

    for name in ("eager-s1", "streaming-s0"):
        (spool / f"{name}.json").unlink()
    assert run_cli("inspect", str(spool)).stdout.startswith("summary: 3 engines, none with a problem\n")


def test_inspect_prints_each_engine_s_memory_by_part(spool: Path) -> None:
    """The parts as the page and /metrics give them, with their shares; the unknown ones named, never printed as 0."""
    golden = Path(__file__).parents[1] / "sidecar" / "golden" / "memory-breakdown"
    for name in ("qwen3-vllm034-dp0.json", "before-breakdown-dp0.json"):
        (spool / name).write_bytes((golden / name).read_bytes())
    out = run_cli("inspect", str(spool), "--stale-after", "1e12").stdout
    lines = [line.split() for line in out.splitlines()]
    assert "memory by part of process_gpu 76.5 GiB" in out
    for row in (
        ["runtime", "1.0", "GiB", "1.3%"],
        ["weights", "15.0", "GiB", "19.6%"],
        ["paged_kv", "57.0", "GiB", "74.5%"],
        ["cuda_graphs", "768.0", "MiB", "1.0%"],
        ["activation_peak", "2.0", "GiB", "2.6%"],
        ["model_local_caches", "712.0", "MiB", "0.9%"],
        ["unexplained", "56.0", "MiB", "0.1%"],
    ):
        assert row in lines, row
    older = out[out.index("engine before-breakdown-dp0") : out.index("engine qwen3-vllm034-dp0")]
    assert (
        "memory by part of process_gpu 20.0 GiB; unknown: runtime, weights, cuda_graphs, activation_peak, "
        "model_local_caches, unexplained" in " ".join(older.split())
    )
    assert ["weights", "0", "B"] not in [row[:3] for row in lines], "unknown is never printed as 0"
    assert "vLLM keeps 2.5 GiB of the device free for torch" in " ".join(out.split())
