"""docs/benchmarks.md opens with today's figures: one marked block per bench, which that bench's ``--record`` rewrites.

Every block names a bench that records into it under the same name, every bench that records has a block, the
blocks come before the history, and the writer replaces exactly its block and nothing else.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from modelkv_testbed import ROOT
from modelkv_testbed.bench_tables import (
    BENCHMARKS,
    block_body,
    block_names,
    end_marker,
    printed_tables,
    recorded,
    with_block,
)

TABLE = "| what | ms |\n|---|---:|\n| a | 1.00 |"


def recorded_names(path: Path) -> list[str]:
    """The names a bench passes to ``recorded(...)``, and whether it offers ``--record``."""
    tree = ast.parse(path.read_text())
    names = [
        call.args[0].value
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "recorded"
        and call.args
        and isinstance(call.args[0], ast.Constant)
    ]
    offers_flag = any(isinstance(node, ast.Constant) and node.value == "--record" for node in ast.walk(tree))
    return names if offers_flag else []


def recording_benches() -> dict[str, list[str]]:
    return {path.stem: recorded_names(path) for path in sorted((ROOT / "bench").glob("*.py")) if recorded_names(path)}


def test_every_block_is_rewritten_by_the_bench_it_names() -> None:
    text = BENCHMARKS.read_text()
    names = block_names(text)
    assert names, "docs/benchmarks.md has a Today section of marked blocks"
    benches = recording_benches()
    assert [name for name in names if benches.get(name) != [name]] == []


def test_every_bench_that_records_has_a_block() -> None:
    assert sorted(set(recording_benches()) - set(block_names(BENCHMARKS.read_text()))) == []


def test_today_comes_before_the_history() -> None:
    text = BENCHMARKS.read_text()
    assert text.index("## Today") < text.index(end_marker(block_names(text)[-1])) < text.index("## History")


def test_rewriting_a_block_with_its_own_body_changes_nothing() -> None:
    text = BENCHMARKS.read_text()
    for name in block_names(text):
        assert with_block(text, name, block_body(text, name)) == text


def test_a_recorded_run_replaces_its_block_only(tmp_path: Path) -> None:
    copy = tmp_path / "benchmarks.md"
    copy.write_text(BENCHMARKS.read_text())
    names = block_names(copy.read_text())
    before = {name: block_body(copy.read_text(), name) for name in names}
    with recorded(names[0], True, path=copy):
        print("a line that is no table\n" + TABLE + "\nratio 0.5")
    after = copy.read_text()
    assert block_body(after, names[0]).startswith(TABLE + "\n\nRun of ")
    assert {name: block_body(after, name) for name in names[1:]} == {name: before[name] for name in names[1:]}
    assert with_block(after, names[0], before[names[0]]) == BENCHMARKS.read_text()


def test_a_run_that_fails_or_is_not_recorded_writes_nothing(tmp_path: Path) -> None:
    copy = tmp_path / "benchmarks.md"
    copy.write_text(BENCHMARKS.read_text())
    name = block_names(copy.read_text())[0]
    with pytest.raises(RuntimeError), recorded(name, True, path=copy):
        print(TABLE)
        raise RuntimeError("the bench failed")
    with recorded(name, False, path=copy):
        print(TABLE)
    assert copy.read_text() == BENCHMARKS.read_text()


def test_a_bench_without_a_block_is_refused() -> None:
    with pytest.raises(KeyError, match="no block for nowhere"):
        with_block(BENCHMARKS.read_text(), "nowhere", TABLE)


def test_a_bench_that_prints_no_table_is_recorded_as_text() -> None:
    assert printed_tables("census 20.1 ms\nslices 33") == "```text\ncensus 20.1 ms\nslices 33\n```"
    assert printed_tables(f"head\n{TABLE}\nbetween\n{TABLE}\n") == f"{TABLE}\n\n{TABLE}"


def test_a_bench_recording_under_another_name_is_caught(tmp_path: Path) -> None:
    bench = tmp_path / "heartbeat.py"
    bench.write_text('import sys\nwith recorded("hartbeat", "--record" in sys.argv):\n    pass\n')
    assert recorded_names(bench) == ["hartbeat"] != [bench.stem]
