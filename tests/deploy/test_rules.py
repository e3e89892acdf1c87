"""The rule file: promtool accepts and unit-tests it, the tests catch broken rules, every alert follows the conventions."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml

from modelkv_exporter.contract import thresholds
from modelkv_exporter.sidecar.label_values import GROWTH_SOURCES
from modelkv_testbed import ROOT
from modelkv_testbed.processes import require_tool
from modelkv_testbed.promql import RULE_TESTS, RULES_FILE, alerts, metric_names, rule_expressions, rule_groups, rules
from modelkv_testbed.promql import known_metric as is_known
from modelkv_testbed.rule_order import with_order

sys.path.insert(0, str(ROOT / "deploy" / "kubernetes"))
import generate_manifests  # noqa: E402

RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_URL = "https://modelkv-exporter.invalid/docs/runbook.md#"


def promtool_test(
    rules_text: str, directory: Path, only: str = "", group_order: Sequence[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of the test files (those named ``only``) against ``rules_text``, copied to ``directory``.

    promtool evaluates the groups in an order of its own unless ``group_order`` names one.
    """
    (directory / "tests").mkdir(parents=True)
    (directory / RULES_FILE.name).write_text(rules_text)
    test_files = [t for t in RULE_TESTS if t.name.startswith(only)]
    for test_file in test_files:
        text = test_file.read_text()
        (directory / "tests" / test_file.name).write_text(with_order(text, group_order) if group_order else text)
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


CPU_OWNER_EXPLAINED = (
    'max without () ({__name__=~"modelkv_engine:owner_declared_peak_bytes:sum|modelkv_observed_peak_bytes"})'
)
"""Per owner of a CPU engine: the larger of its declared peak and the most its caches ever held."""


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
    names = {r.get("record") for r in devices["rules"]}
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
        "            and on (job, instance, engine) modelkv_engine:alone_on_device:info\n          )\n",
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
        "              or\n              max without (found_by) (\n                modelkv_discovered_recent_peak_bytes\n",
        "              or\n              0 * max without (found_by) (\n                modelkv_discovered_recent_peak_bytes\n",
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
    "a CPU engine's settled heap paged as growth": (
        "          unless on (job, instance, engine) (\n            modelkv_engine:resident_measured:info\n",
        "          unless on (job, instance, engine) (\n            modelkv_engine:resident_measured:info * 0 > 0\n",
        "ModelKVUndeclaredMemoryGrowth",
        "story-g",
    ),
    "a CPU engine's level without its growth": (
        "modelkv_engine:resident_measured:info\n            unless on (job, instance, engine) (",
        "modelkv_engine:resident_measured:info == 2\n            unless on (job, instance, engine) (",
        "ModelKVUndeclaredMemoryGrowth",
        "story-g",
    ),
    "a CPU engine's warm-up taken for growth (rising for 20 minutes, not 30)": (
        "\n              and modelkv_engine:undeclared_memory_bytes offset 25m - modelkv_engine:undeclared_memory_bytes"
        " offset 30m >= 20 * 1024 * 1024",
        "",
        "ModelKVUndeclaredMemoryGrowth",
        "story-oncall-b",
    ),
    "a slow CPU leak not seen (no test over two hours)": (
        "modelkv_engine:undeclared_memory_bytes offset 1h >= 20 * 1024 * 1024",
        "modelkv_engine:undeclared_memory_bytes offset 1h >= 2000 * 1024 * 1024",
        "ModelKVUndeclaredMemoryGrowth",
        "story-oncall-b",
    ),
    "a leak's page resolved by a scrape gap": (
        "offset 2h >= 20 * 1024 * 1024\n            )\n          )\n        for: 15m\n        keep_firing_for: 10m\n",
        "offset 2h >= 20 * 1024 * 1024\n            )\n          )\n        for: 15m\n",
        "ModelKVUndeclaredMemoryGrowth",
        "story-h",
    ),
    "a stale engine let off by a scrape gap": (
        "last_over_time(modelkv_engine_up[10m]) == 0",
        "modelkv_engine_up == 0",
        "ModelKVSnapshotStale",
        "story-h",
    ),
    "a fast fill left to the hourly prediction": (
        "        for: 5m\n        keep_firing_for: 10m\n        labels:\n          severity: critical\n",
        "        for: 15m\n        keep_firing_for: 10m\n        labels:\n          severity: critical\n",
        "ModelKVDeviceMemoryExhaustionImminent",
        "story-i",
    ),
    "a step taken for a fast fill": (
        "          and modelkv_engine:device_committed_bytes:sum > modelkv_engine:device_committed_bytes:sum offset 5m\n"
        "          and modelkv_engine:device_committed_bytes:sum offset 5m > modelkv_engine:device_committed_bytes:sum"
        " offset 10m\n",
        "",
        "ModelKVDeviceMemoryExhaustionImminent",
        "story-i",
    ),
    "a loading engine taken for a fast fill": (
        "modelkv_engine:device_engine_age_seconds:min > 900",
        "modelkv_engine:device_engine_age_seconds:min > 0",
        "ModelKVDeviceMemoryExhaustionImminent",
        "story-e",
    ),
    "an undeclared cache used in bursts judged by its last interval": (
        "max_over_time(modelkv_engine:discovered_undeclared_recent_peak_bytes:max[1h]) > 64",
        "modelkv_engine:discovered_undeclared_recent_peak_bytes:max > 64",
        "ModelKVUndeclaredCache",
        "story-j",
    ),
    "a sleeping engine's device taken for its own": (
        "\n          unless on (job, instance, engine) modelkv_engine_sleep_level > 0\n",
        "\n",
        "ModelKVUndeclaredMemoryGrowth",
        "story-m",
    ),
    "a sleeping engine's pending cache set against what a trainer borrows": (
        "(modelkv_engine:declared_peak_pending_bytes unless on (job, instance, engine) modelkv_engine_sleep_level > 0)",
        "modelkv_engine:declared_peak_pending_bytes",
        "ModelKVDeclaredPeakWillNotFit",
        "story-m",
    ),
    "owners whose cache calls are not counted (unobservable, or a plain-tensor cache) counted as unused": (
        "and on (job, instance, engine, owner) modelkv_observed_calls_total\n",
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


@pytest.mark.slow
@pytest.mark.parametrize("case", BREAKS, ids=list(BREAKS))
def test_promtool_unit_tests_catch_a_broken_rule(
    case: str, tmp_path: Path, passes_intact: Callable[[str], bool]
) -> None:
    """Each rule the situations depend on, broken on purpose, fails its tests.

    The groups are evaluated in file order: left to promtool, the order changes from run to run, and a story
    may exercise a guard in one order only (without the age guard, story-e's loading engine reaches
    ``ModelKVDeviceMemoryExhaustionImminent`` in file order, not in reverse).
    """
    old, new, name, test_file = BREAKS[case]
    original = RULES_FILE.read_text()
    order = [g["name"] for g in rule_groups()]
    assert old in original, "the rule to break is no longer written this way"
    assert passes_intact(test_file), f"{test_file} fails with the rules as they are"
    result = promtool_test(original.replace(old, new), tmp_path / "broken", test_file, group_order=order)
    assert result.returncode != 0, f"{case}: the unit tests still pass"
    assert name in result.stdout + result.stderr


def test_the_observation_alerts_have_their_own_group() -> None:
    (group,) = [g for g in rule_groups() if g["name"] == "modelkv.observation"]
    assert {r["alert"] for r in group["rules"] if "alert" in r} == {
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


WHAT_TO_DO_NOW = "**What to do now.**"
"""How every alert's runbook section opens: numbered steps for the person paged, a command in the first."""
FIRST_COMMAND_WORDS = 16
"""Words of a section within which its first command starts."""
FIRST_STEP_WORDS = 60
"""Words of a section within which its first step, the command with what to keep or look for, has ended."""
WHAT_TO_DO_NOW_WORDS = 150
"""The most words the steps may take, so that what the alert means follows soon after."""
COMMAND = re.compile(r"`(?:kubectl|curl|amtool|modelkv-exporter) ")


def runbook_sections(text: str) -> dict[str, str]:
    """Each ``## `` section of the runbook by its heading, without the heading."""
    return {m.group(1): m.group(2) for m in re.finditer(r"(?ms)^## ([^\n]+)\n(.*?)(?=^## |\Z)", text)}


def what_to_do_now_problems(text: str, names: set[str]) -> list[str]:
    """Why the sections of the alerts ``names`` do not open with what to do now, one line each; none when they do."""
    sections, problems = runbook_sections(text), []
    for name in sorted(names):
        body = sections.get(name, "").strip()
        if not body:
            problems.append(f"{name}: no section")
            continue
        block = body.split("\n\n", 1)[0]
        numbers = re.findall(r"(?m)^(\d+)\. ", block)
        if not block.startswith(WHAT_TO_DO_NOW + "\n1. ") or numbers != [str(n + 1) for n in range(len(numbers))]:
            problems.append(f"{name}: does not open with {WHAT_TO_DO_NOW} and numbered steps")
            continue
        first = re.split(r"(?m)^\d+\. ", block)[1]
        command = COMMAND.search(first)
        if command is None or len((WHAT_TO_DO_NOW + " " + first[: command.start()]).split()) > FIRST_COMMAND_WORDS:
            problems.append(f"{name}: the first step does not start with a command")
        if len((WHAT_TO_DO_NOW + " " + first).split()) > FIRST_STEP_WORDS:
            problems.append(f"{name}: the first step ends after {FIRST_STEP_WORDS} words")
        if len(block.split()) > WHAT_TO_DO_NOW_WORDS:
            problems.append(f"{name}: what to do now takes more than {WHAT_TO_DO_NOW_WORDS} words")
    return problems


def test_every_alerts_runbook_section_opens_with_what_to_do_now() -> None:
    """On call reaches the first command within a few words of the alert's heading, and the steps are short; every
    alert in the rule file has its section. Checked on the runbook broken three ways, each of which it reports."""
    names = {alert["alert"] for alert in alerts()}
    runbook = RUNBOOK.read_text()
    assert what_to_do_now_problems(runbook, names) == []
    growth = runbook_sections(runbook)["ModelKVUndeclaredMemoryGrowth"]
    steps, meaning = growth.strip().split("\n\n", 2)[:2]
    below_meaning = runbook.replace(
        growth.strip(), growth.strip().replace(f"{steps}\n\n{meaning}", f"{meaning}\n\n{steps}")
    )
    without_command = runbook.replace(steps, re.sub(r"`[^`]*`", "the sidecar's output", steps, count=4))
    without_section = runbook.replace("## ModelKVSnapshotStale\n", "## Snapshot staleness\n")
    assert what_to_do_now_problems(below_meaning, names) == [
        f"ModelKVUndeclaredMemoryGrowth: does not open with {WHAT_TO_DO_NOW} and numbered steps"
    ]
    assert what_to_do_now_problems(without_command, names) == [
        "ModelKVUndeclaredMemoryGrowth: the first step does not start with a command"
    ]
    assert what_to_do_now_problems(without_section, names) == ["ModelKVSnapshotStale: no section"]


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


def rule_thresholds(text: str) -> dict[str, float]:
    """The thresholds the rule file judges by, read back from its expressions as numbers."""
    groups = yaml.safe_load(text)["groups"]
    defaults = generate_manifests.rule_defaults(groups)
    (under,) = [r for g in groups for r in g["rules"] if r.get("alert") == "ModelKVDeclarationUnderReports"]
    tolerance = re.search(r"group_left \(\)\s+([0-9.]+) \* sum", under["expr"])
    assert tolerance, under["expr"]
    growth = [r for g in groups for r in g["rules"] if r.get("alert") == "ModelKVUndeclaredMemoryGrowth"]
    steps = {int(n) for r in growth for n in re.findall(r">= (\d+) \* 1024 \* 1024", r["expr"])}
    assert len(steps) == 1, steps
    return {
        "UNDER_REPORT_TOLERANCE": float(tolerance.group(1)),
        "RISING_MIN_STEP_BYTES": steps.pop() * thresholds.MIB,
        "UNDECLARED_GROWTH_BYTES": defaults["undeclaredMemoryGrowth"]["thresholdMiB"] * thresholds.MIB,
        "UNDECLARED_CACHE_BYTES": defaults["undeclaredCache"]["thresholdMiB"] * thresholds.MIB,
        "UNUSED_MIN_CALLS": defaults["declaredCacheUnused"]["minCalls"],
        "NO_ENGINE_SECONDS": defaults["noEnginePublishing"]["forMinutes"] * 60,
    }


def shared_thresholds() -> dict[str, float]:
    """The one definition (modelkv_exporter.contract.thresholds), by name."""
    return {name: getattr(thresholds, name) for name in rule_thresholds(RULES_FILE.read_text())}


def test_the_rules_judge_by_the_shared_thresholds() -> None:
    """Every threshold the rules write is the one modelkv_exporter.contract.thresholds defines, which the landing
    page reads; a number changed in the rules alone fails."""
    assert rule_thresholds(RULES_FILE.read_text()) == shared_thresholds()
    for old, new in (
        ("1.05 * sum without", "1.1 * sum without"),
        ("modelkv_engine:undeclared_memory_bytes > 256 * 1024", "modelkv_engine:undeclared_memory_bytes > 300 * 1024"),
        (">= 20 * 1024 * 1024", ">= 24 * 1024 * 1024"),
    ):
        assert old in RULES_FILE.read_text()
        assert rule_thresholds(RULES_FILE.read_text().replace(old, new)) != shared_thresholds(), old


def test_the_charts_defaults_are_the_shared_thresholds() -> None:
    """The chart's values are generated from the rule file; its defaults are the shared numbers too."""
    alerts = yaml.safe_load((ROOT / "deploy" / "helm" / "modelkv-exporter" / "values.yaml").read_text())[
        "prometheusRule"
    ]["alerts"]
    assert alerts["undeclaredMemoryGrowth"]["thresholdMiB"] * thresholds.MIB == thresholds.UNDECLARED_GROWTH_BYTES
    assert alerts["undeclaredCache"]["thresholdMiB"] * thresholds.MIB == thresholds.UNDECLARED_CACHE_BYTES
    assert alerts["declaredCacheUnused"]["minCalls"] == thresholds.UNUSED_MIN_CALLS
    assert alerts["noEnginePublishing"]["forMinutes"] * 60 == thresholds.NO_ENGINE_SECONDS


def test_paging_alerts_ride_over_a_scrape_gap_of_ten_minutes() -> None:
    """A scrape gap leaves no sample: an alert whose inputs it removes keeps firing for 10 minutes
    (keep_firing_for) or reads its input's last value over 10 minutes (last_over_time). The exporter's own
    availability alerts are about the gap itself and read up, which a gap sets to 0."""
    about_the_gap = {"ModelKVExporterDown", "ModelKVExporterAbsent"}
    for alert in alerts():
        if alert["alert"] in about_the_gap:
            assert "keep_firing_for" not in alert, alert["alert"]
            continue
        minutes = re.fullmatch(r"(\d+)m", alert.get("keep_firing_for", "0m"))
        assert minutes and int(minutes.group(1)) >= 10 or "last_over_time(modelkv_engine_up[10m])" in alert["expr"], (
            alert["alert"]
        )
