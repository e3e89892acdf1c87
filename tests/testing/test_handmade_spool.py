"""Issue 47: ``publish()`` then ``modelkv-exporter check SPOOL``, as docs/declaring-caches.md shows it, judges.

On main (3896f48) a ``publish()`` snapshot carried declarations only, and the check printed every owner "not
observed", exit 1, without saying what it needed. Now ``publish(..., observer=observer)`` after the model ran carries
the observations and the check judges them; without an observer the check says exactly what it needs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from modelkv_exporter.engine.observe import Observer
from modelkv_exporter.testing import check
from modelkv_testbed import ROOT
from tests.engine.test_examples import python_block
from tests.testing.handmade import StaticRing, declare, drive

MARKER = "<!-- example: check-from-a-spool"


def judged(spool: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", "check", str(spool)], capture_output=True, text=True
    )


def run_example(spool: Path, specs: list) -> dict[str, object]:
    code = python_block(ROOT / "docs" / "declaring-caches.md", MARKER).replace("/var/run/modelkv", str(spool))
    namespace: dict[str, object] = {"build_my_model": lambda: StaticRing(specs, 4), "drive": drive}
    exec(compile(code, "declaring-caches.md", "exec"), namespace)  # noqa: S102 - the doc's own example
    return namespace


def test_the_documented_spool_path_judges_the_declaration(tmp_path: Path) -> None:
    run_example(tmp_path, [declare()])
    result = judged(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   (root) (StaticRing): holds what it declares (9,216 B)" in result.stdout, result.stdout


def test_the_spool_path_gives_the_same_verdict_as_the_check(tmp_path: Path) -> None:
    wrong = [declare(physical_capacity_positions=3)]
    report = check(StaticRing(wrong, 4), drive, max_num_seqs=4, batches=(1, 4))
    namespace = run_example(tmp_path, wrong)
    assert isinstance(namespace["observer"], Observer)
    result = judged(tmp_path)
    assert result.returncode == 1
    assert f"FAIL (root) (StaticRing): {report.owner('').verdict.text}" in result.stdout, result.stdout


def test_a_snapshot_without_observations_says_what_the_check_needs(tmp_path: Path) -> None:
    from modelkv_exporter import publish

    publish(StaticRing([declare()], 4), spool_dir=tmp_path, max_num_seqs=4, engine_id="declarations-only")
    result = judged(tmp_path)
    assert result.returncode == 1
    text = " ".join(result.stdout.split())
    assert "FAIL nothing judged: this snapshot carries declarations and no observations" in text, result.stdout
    assert "publish(model, ..., observer=observer) writes after the model ran" in text
