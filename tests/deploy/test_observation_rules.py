"""The modelkv.observation alerts: promtool's unit tests catch each of their safeguards when it is taken out."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.processes import require_tool
from tests.support.promql import RULE_TESTS, RULES_FILE, rule_groups

OBSERVATION_TESTS = [path for path in RULE_TESTS if path.name == "observation.test.yaml"]
BROKEN = {
    "no tolerance": (
        "1.05 * sum without (cache, scope, rows) (modelkv_declared_peak_bytes)",
        "sum without (cache, scope, rows) (modelkv_declared_peak_bytes)",
    ),
    "an owner declaring nothing is let off": (
        "unless on (job, instance, engine, owner) modelkv_declared_peak_bytes",
        "and on (job, instance, engine, owner) modelkv_declared_peak_bytes",
    ),
    "no ride over restarts": ("keep_firing_for: 15m\n", ""),
    "unobservable owners count as unused": (
        "and on (job, instance, engine, owner) modelkv_observation_available == 1\n",
        "",
    ),
    "owners that declare nothing count as unused": (
        "and on (job, instance, engine, owner) sum without (cache, scope, rows) (modelkv_declared_peak_bytes)\n",
        "",
    ),
}


def run_tests(tmp_path: Path, rules: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / RULES_FILE.name).write_text(rules)
    for test_file in OBSERVATION_TESTS:
        (tmp_path / "tests" / test_file.name).write_text(test_file.read_text())
    return subprocess.run(
        [require_tool("promtool"), "test", "rules", *(t.name for t in OBSERVATION_TESTS)],
        capture_output=True,
        text=True,
        cwd=tmp_path / "tests",
    )


def test_the_observation_alerts_have_their_own_group_and_test_file() -> None:
    (group,) = [g for g in rule_groups() if g["name"] == "modelkv.observation"]
    assert {r["alert"] for r in group["rules"]} == {"ModelKVDeclarationUnderReports", "ModelKVDeclaredCacheUnused"}
    assert OBSERVATION_TESTS


def test_the_unbroken_rules_pass(tmp_path: Path) -> None:
    result = run_tests(tmp_path, RULES_FILE.read_text())
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_promtool_unit_tests_catch_a_broken_safeguard(tmp_path: Path, case: str) -> None:
    old, new = BROKEN[case]
    rules = RULES_FILE.read_text()
    assert rules.count(old) == 1, case
    result = run_tests(tmp_path, rules.replace(old, new))
    assert result.returncode != 0, f"{case}: the unit tests still pass"
    assert "FAILED" in result.stdout + result.stderr
