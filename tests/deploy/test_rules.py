"""The rule file: promtool accepts and unit-tests it, every alert is covered both ways and documented."""

from __future__ import annotations

import re
import subprocess

import yaml

from modelkv_exporter.contract.vocabulary import GROWTH_SOURCES
from tests.support import ROOT
from tests.support.processes import require_tool
from tests.support.promql import RULE_TESTS, RULES_FILE, alerts, metric_names, rule_expressions, rules
from tests.support.promql import known_metric as is_known

RUNBOOK = ROOT / "docs" / "runbook.md"


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [require_tool("promtool"), "check", "rules", str(RULES_FILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    assert RULE_TESTS, "no promtool test files"
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", *map(str, RULE_TESTS)],
        capture_output=True,
        text=True,
        cwd=RULE_TESTS[0].parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_catch_a_broken_rule(tmp_path) -> None:
    """The unit tests can fail: declared peak added instead of subtracted must be caught."""
    broken = RULES_FILE.read_text().replace("- ignoring (source) group_left", "+ ignoring (source) group_left")
    assert broken != RULES_FILE.read_text()
    (tmp_path / "tests").mkdir()
    (tmp_path / RULES_FILE.name).write_text(broken)
    for test_file in RULE_TESTS:
        (tmp_path / "tests" / test_file.name).write_text(test_file.read_text())
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", *(t.name for t in RULE_TESTS)],
        capture_output=True,
        text=True,
        cwd=tmp_path / "tests",
    )
    assert result.returncode != 0 and "ModelKVUndeclaredMemoryGrowth" in result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases: dict[str, list[bool]] = {}
    for test_file in RULE_TESTS:
        for group in yaml.safe_load(test_file.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    for alert in alerts():
        assert set(cases.get(alert["alert"], [])) == {True, False}, f"{alert['alert']} needs both cases"


def test_every_alert_is_annotated_and_has_a_runbook_section() -> None:
    runbook = RUNBOOK.read_text()
    anchors = {re.sub(r"[^a-z0-9-]", "", h.lower().replace(" ", "-")) for h in re.findall(r"^## (.+)$", runbook, re.M)}
    for alert in alerts():
        annotations = alert["annotations"]
        assert annotations["summary"] and annotations["description"], alert["alert"]
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}
        path, anchor = annotations["runbook"].split("#")
        assert (ROOT / path) == RUNBOOK and anchor in anchors, alert["alert"]
    for rule in rules():
        if "record" in rule:
            assert f"`{rule['record']}`" in runbook, rule["record"]


def test_rules_select_only_metrics_that_exist() -> None:
    for expression in rule_expressions():
        names = metric_names(expression.expr)
        assert names, expression.origin
        unknown = [name for name in names if not is_known(name)]
        assert not unknown, f"{expression.origin}: {unknown}"


def test_growth_sources_agree_with_the_catalogue() -> None:
    (growth,) = [rule for rule in rules() if rule.get("record") == "modelkv_engine:memory_growth_bytes"]
    assert tuple(re.findall(r'"source", "(\w+)"', growth["expr"])) == GROWTH_SOURCES
    for source in GROWTH_SOURCES:
        assert f"modelkv_memory_{source}_bytes - modelkv_memory_{source}_baseline_bytes" in growth["expr"]


def test_recording_rules_follow_the_naming_convention() -> None:
    for rule in rules():
        if "record" in rule:
            level, metric, *_ = rule["record"].split(":")
            assert level == "modelkv_engine" and re.fullmatch(r"[a-z0-9_]+_(bytes|device|sum)", metric + "_sum")
