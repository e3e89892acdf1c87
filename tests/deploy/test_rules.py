"""The rule file: promtool accepts and unit-tests it, the tests catch broken rules, every alert follows the conventions."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from modelkv_exporter.sidecar.vocabulary import GROWTH_SOURCES
from tests.support import ROOT
from tests.support.processes import require_tool
from tests.support.promql import RULE_TESTS, RULES_FILE, alerts, metric_names, rule_expressions, rule_groups, rules
from tests.support.promql import known_metric as is_known

RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_URL = "https://modelkv-exporter.invalid/docs/runbook.md#"


def promtool_test(
    rules_text: str, directory: Path, only: str = "", group_order: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of the test files (those named ``only``) against ``rules_text``, copied to ``directory``.

    promtool evaluates the groups in an order of its own unless ``group_order`` names one.
    """
    (directory / "tests").mkdir(parents=True)
    (directory / RULES_FILE.name).write_text(rules_text)
    test_files = [t for t in RULE_TESTS if t.name.startswith(only)]
    for test_file in test_files:
        text = test_file.read_text()
        if group_order:
            text = re.sub(
                r"^rule_files:", f"group_eval_order: [{', '.join(group_order)}]\nrule_files:", text, count=1, flags=re.M
            )
        (directory / "tests" / test_file.name).write_text(text)
    return subprocess.run(
        [require_tool("promtool"), "test", "rules", *(t.name for t in test_files)],
        capture_output=True,
        text=True,
        cwd=directory / "tests",
    )


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [require_tool("promtool"), "check", "rules", str(RULES_FILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    assert len(RULE_TESTS) >= 4, "no promtool test files"
    result = promtool_test(RULES_FILE.read_text(), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


CPU_OWNER_EXPLAINED = (
    'max without () ({__name__=~"modelkv_engine:owner_declared_peak_bytes:sum|modelkv_observed_peak_bytes"})'
)
"""Per owner of a CPU engine: the larger of its declared peak and the most its caches ever held."""


@pytest.mark.parametrize("reverse", [False, True], ids=["in file order", "in reverse"])
def test_the_tests_pass_whichever_group_reads_the_others_first(reverse: bool, tmp_path: Path) -> None:
    """In file order every group reads this evaluation's results of the groups above it; in reverse, the last's.

    A Prometheus evaluates its groups at offsets of its own in the interval: both extremes must hold.
    """
    order = [g["name"] for g in rule_groups()]
    result = promtool_test(RULES_FILE.read_text(), tmp_path, group_order=order[::-1] if reverse else order)
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_group_reads_only_its_own_and_earlier_groups_results() -> None:
    """No group waits an interval for a later one; a rule reads its own group's results only once recorded."""
    recorded: dict[str, tuple[int, int]] = {}
    for g, group in enumerate(rule_groups()):
        for r, rule in enumerate(group["rules"]):
            if "record" in rule:
                recorded.setdefault(rule["record"], (g, r))
    for g, group in enumerate(rule_groups()):
        for r, rule in enumerate(group["rules"]):
            for name in set(re.findall(r"modelkv_engine:[a-z_:]*[a-z_]", rule["expr"])):
                where = recorded[name]
                own = rule.get("record") == name
                assert where[0] < g or (where[0] == g and (where[1] < r or own)), (group["name"], rule, name)


def test_a_devices_figures_are_computed_in_one_group() -> None:
    """Used memory and the pending cache move together while a cache fills: their sums must be of one evaluation."""
    (devices,) = [g for g in rule_groups() if g["name"] == "modelkv.devices"]
    names = {r["record"] for r in devices["rules"]}
    assert {
        "modelkv_engine:memory_growth_bytes",
        "modelkv_engine:declared_peak_pending_bytes",
        "modelkv_engine:device_used_bytes:max",
        "modelkv_engine:device_declared_pending_bytes:sum",
        "modelkv_engine:device_committed_bytes:sum",
    } <= names


BREAKS = {
    "growth measured on the caching allocator": (
        "modelkv_memory_torch_allocated_high_water_bytes - modelkv_memory_torch_allocated_high_water_baseline_bytes",
        "modelkv_memory_torch_reserved_bytes - modelkv_memory_torch_reserved_baseline_bytes",
        "ModelKVUndeclaredMemoryGrowth",
        "undeclared-growth",
    ),
    "the high-water mark without the profiled activation peak": (
        "modelkv_memory_torch_allocated_high_water_bytes - modelkv_memory_torch_allocated_high_water_baseline_bytes",
        "modelkv_memory_torch_allocated_high_water_bytes - modelkv_memory_torch_allocated_baseline_bytes",
        "ModelKVUndeclaredMemoryGrowth",
        "undeclared-growth",
    ),
    "memory outside torch ignored": (
        "+ clamp_min(modelkv_engine:non_torch_growth_bytes, 0)",
        "+ 0 * modelkv_engine:non_torch_growth_bytes",
        "ModelKVUndeclaredMemoryGrowth",
        "undeclared-growth",
    ),
    "a missed NVML sample not bridged": (
        "last_over_time(modelkv_memory_process_gpu_bytes[5m]) - modelkv_memory_process_gpu_baseline_bytes\n"
        "            or\n",
        "modelkv_memory_process_gpu_bytes - modelkv_memory_process_gpu_baseline_bytes\n            or\n",
        "ModelKVUndeclaredMemoryGrowth",
        "undeclared-growth",
    ),
    "observed cache bytes ignored": (
        "modelkv_observed_recent_peak_bytes\n              or\n",
        "",
        "ModelKVUndeclaredMemoryGrowth",
        "undeclared-growth",
    ),
    "replicas summed": (
        "sum without (owner, cache, scope, rows) (modelkv_declared_peak_bytes)\n",
        "sum without (owner, cache, scope, rows, instance, pod) (modelkv_declared_peak_bytes)\n",
        "modelkv_engine:declared_peak_bytes:sum",
        "undeclared-growth",
    ),
    "every engine alone with the free memory of a shared device": (
        "modelkv_engine:device_declared_pending_bytes:sum\n          > modelkv_engine:device_total_bytes:max"
        " - modelkv_engine:device_used_bytes:max",
        "modelkv_engine:declared_peak_pending_bytes > modelkv_engine:device_free_bytes",
        "ModelKVDeclaredPeakWillNotFit",
        "devices",
    ),
    "a step predicted as a trend": (
        "predict_linear(modelkv_engine:device_committed_bytes:sum[10m]",
        "predict_linear(modelkv_engine:device_committed_bytes:sum[1h]",
        "ModelKVDeviceMemoryExhaustionPredicted",
        "story-a",
    ),
    "a young engine's fast leak left to the hour-long prediction": (
        "(1800 < modelkv_engine:device_engine_age_seconds:min <= 5400)",
        "(5400 < modelkv_engine:device_engine_age_seconds:min <= 5400)",
        "ModelKVDeviceMemoryExhaustionPredicted",
        "story-e",
    ),
    "a CPU engine explained by its caches' recent peak": (
        CPU_OWNER_EXPLAINED,
        "modelkv_observed_recent_peak_bytes",
        "ModelKVUndeclaredMemoryGrowth",
        "story-b",
    ),
    "a CPU engine's caches held beyond their declaration not explained": (
        CPU_OWNER_EXPLAINED,
        "modelkv_engine:owner_declared_peak_bytes:sum",
        "ModelKVUndeclaredMemoryGrowth",
        "story-b",
    ),
    "non-torch memory of a shared device taken from its used memory": (
        "            and on (job, instance, engine) modelkv_engine:alone_on_device\n          )\n",
        "          )\n",
        "ModelKVUndeclaredMemoryGrowth",
        "story-d",
    ),
    "pending cache from memory growth where caches are observed": (
        "\n          and on (job, instance, engine) modelkv_observed_peak_bytes\n",
        "\n          and on (job, instance, engine) modelkv_observed_peak_bytes * 0 > 0\n",
        "ModelKVDeclaredPeakWillNotFit",
        "story-c",
    ),
    "a stale neighbour counted as gone": (
        "(count by (device_key) (modelkv_engine:device:info or modelkv_engine:stale:info) == 1)",
        "(count by (device_key) (modelkv_engine:device:info) == 1)",
        "ModelKVUndeclaredMemoryGrowth",
        "story-d",
    ),
    "a hung engine let off once its file is forgotten": (
        "\n          or\n          (modelkv_engine:stale:info unless on (job, instance, engine) modelkv_engine_up)\n"
        '          and on (job, instance) (modelkv_exporter_spool_files{state="forgotten"} > 0)\n',
        "\n",
        "ModelKVSnapshotStale",
        "story-e",
    ),
    "discovered caches not explained": (
        "              or\n              modelkv_engine:discovered_undeclared_recent_peak_bytes:max\n",
        "\n",
        "ModelKVUndeclaredMemoryGrowth",
        "story-f",
    ),
    "declaring owners reported as undeclared caches": (
        'modelkv_discovered_owner_info{declares="false"}\n          )\n',
        "modelkv_discovered_owner_info\n          )\n",
        "ModelKVUndeclaredCache",
        "story-f",
    ),
    "declared caches filling toward their peak predicted": (
        "modelkv_engine:device_committed_bytes:sum[",
        "modelkv_engine:device_used_bytes:max[",
        "ModelKVDeviceMemoryExhaustionPredicted",
        "devices",
    ),
    "a failed declarer ignored": (
        "expr: modelkv_engine_declarations_dropped > 0",
        "expr: modelkv_engine_declarations_dropped > 1",
        "ModelKVDeclarationsDropped",
        "declarations",
    ),
    "declarations compared with the last minute only": (
        "max_over_time(modelkv_engine:declarations_by_model:max[1d])",
        "max_over_time(modelkv_engine:declarations_by_model:max[1m])",
        "ModelKVDeclarationsDropped",
        "declarations",
    ),
    "an under-report without tolerance": (
        "1.05 * sum without (cache, scope, rows) (modelkv_declared_peak_bytes)",
        "sum without (cache, scope, rows) (modelkv_declared_peak_bytes)",
        "ModelKVDeclarationUnderReports",
        "observation",
    ),
    "an owner declaring nothing let off": (
        "unless on (job, instance, engine, owner) modelkv_declared_peak_bytes",
        "and on (job, instance, engine, owner) modelkv_declared_peak_bytes",
        "ModelKVDeclarationUnderReports",
        "observation",
    ),
    "an under-report forgotten at a restart": (
        "        keep_firing_for: 15m\n",
        "",
        "ModelKVDeclarationUnderReports",
        "observation",
    ),
    "unobservable owners counted as unused": (
        "and on (job, instance, engine, owner) modelkv_observation_available == 1\n",
        "",
        "ModelKVDeclaredCacheUnused",
        "observation",
    ),
    "owners that declare nothing counted as unused": (
        "and on (job, instance, engine, owner) sum without (cache, scope, rows) (modelkv_declared_peak_bytes)\n",
        "",
        "ModelKVDeclaredCacheUnused",
        "observation",
    ),
}


@pytest.mark.parametrize("case", BREAKS, ids=list(BREAKS))
def test_promtool_unit_tests_catch_a_broken_rule(case: str, tmp_path: Path) -> None:
    """Each rule the situations depend on, broken on purpose, fails its tests."""
    old, new, name, test_file = BREAKS[case]
    original = RULES_FILE.read_text()
    assert old in original, "the rule to break is no longer written this way"
    assert promtool_test(original, tmp_path / "intact", test_file).returncode == 0
    result = promtool_test(original.replace(old, new), tmp_path / "broken", test_file)
    assert result.returncode != 0, f"{case}: the unit tests still pass"
    assert name in result.stdout + result.stderr


def test_the_observation_alerts_have_their_own_group() -> None:
    (group,) = [g for g in rule_groups() if g["name"] == "modelkv.observation"]
    assert {r["alert"] for r in group["rules"]} == {
        "ModelKVDeclarationUnderReports",
        "ModelKVUndeclaredCache",
        "ModelKVDeclaredCacheUnused",
    }


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases: dict[str, list[bool]] = {}
    for test_file in RULE_TESTS:
        for group in yaml.safe_load(test_file.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    for alert in alerts():
        assert set(cases.get(alert["alert"], [])) == {True, False}, f"{alert['alert']} needs both cases"


def test_alerts_follow_the_monitoring_mixin_conventions() -> None:
    """A `for` on every alert, static summaries, descriptions naming namespace and pod, absolute runbook URLs."""
    runbook = RUNBOOK.read_text()
    anchors = {re.sub(r"[^a-z0-9-]", "", h.lower().replace(" ", "-")) for h in re.findall(r"^## (.+)$", runbook, re.M)}
    for alert in alerts():
        name, annotations = alert["alert"], alert["annotations"]
        assert re.fullmatch(r"\d+[mh]", alert.get("for", "")), f"{name} has no for"
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}
        assert annotations["summary"] and "{{" not in annotations["summary"], f"{name}: summary is not static"
        if name != "ModelKVExporterAbsent":
            assert re.search(r"\.Labels\.namespace|\$labels\.namespace", annotations["description"]), name
            assert re.search(r"\.Labels\.pod|\$labels\.pod", annotations["description"]), name
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        url = annotations["runbook_url"]
        assert url.startswith(RUNBOOK_URL) and url.removeprefix(RUNBOOK_URL) in anchors, f"{name}: {url}"
        assert url.removeprefix(RUNBOOK_URL) == name.lower()
    for rule in rules():
        if "record" in rule:
            assert f"`{rule['record']}`" in runbook, rule["record"]


def test_predictions_warn_before_they_turn_critical() -> None:
    by_name: dict[str, list[dict]] = {}
    for alert in alerts():
        by_name.setdefault(alert["alert"], []).append(alert)
    predictions = by_name["ModelKVDeviceMemoryExhaustionPredicted"]
    horizons = {a["labels"]["severity"]: re.search(r"\[1h\], ([^)]+)\)", a["expr"]).group(1) for a in predictions}  # type: ignore[union-attr]
    assert horizons == {"warning": "4 * 3600", "critical": "3600"}
    for alerts_of_name in by_name.values():
        severities = [a["labels"]["severity"] for a in alerts_of_name]
        if "critical" in severities and len(alerts_of_name) > 1:
            assert "warning" in severities


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
        assert f"modelkv_memory_{source}_bytes" in growth["expr"]
        assert f"- modelkv_memory_{source}_baseline_bytes" in growth["expr"]


def test_every_recorded_series_is_federated_by_one_pattern() -> None:
    """Every recording rule records modelkv_engine:<metric>[:<operation>], so one match[] federates them all."""
    for rule in rules():
        if "record" in rule:
            assert re.fullmatch(r"modelkv_engine:[a-z0-9_]+(:[a-z0-9_]+)?", rule["record"]), rule["record"]


def test_the_job_selector_is_written_the_same_way_everywhere() -> None:
    """generate_manifests.py replaces it as one string: no other spelling may hide from it."""
    text = RULES_FILE.read_text()
    assert re.findall(r'job\s*=~?\s*"[^"]*"', text) == ['job="modelkv-exporter"'] * text.count('job="modelkv-exporter"')
    assert text.count('job="modelkv-exporter"') >= 4
