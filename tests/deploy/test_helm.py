"""deploy/helm: the chart renders and lints with Helm's own engine, agrees with the kustomize base and the rule
file, refuses wrong values."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.test_kubernetes import (
    CUSTOM_KINDS,
    KUBERNETES,
    SUPPORTED_VERSIONS,
    build,
    check_custom_resources,
    generate_manifests,
    one,
)
from tests.support import ROOT
from tests.support.promql import DASHBOARDS, RULES_FILE

CHART = ROOT / "deploy" / "helm" / "modelkv-exporter"
HELM_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
"""Labels Helm's conventions add and the kustomize base has no counterpart for."""


def render(values: dict[str, Any] | None = None, namespace: str = "monitoring") -> list[dict[str, Any]]:
    """The chart rendered by Helm's engine with ``values``, as objects."""
    manifests = helm.Chart.load(CHART).render(values or {}, name="modelkv", namespace=namespace)
    return [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render()


def rules_of(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return one(objects, "PrometheusRule")["spec"]["groups"]


def as_kustomize(obj: dict[str, Any]) -> dict[str, Any]:
    """The chart's object without what only Helm adds: its labels and, where the base has none, the namespace."""
    obj = copy.deepcopy(obj)
    for label in HELM_LABELS:
        obj["metadata"]["labels"].pop(label)
    return obj


def test_chart_lints_clean() -> None:
    report = helm.lint(CHART, strict=True, kube_version="v1.29.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] > 1] == []


def test_rendered_objects_validate(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    assert {o["kind"] for o in rendered} == CUSTOM_KINDS | {"ConfigMap"}
    for version in SUPPORTED_VERSIONS:
        kubernetes_validate.validate(one(rendered, "ConfigMap"), version, strict=True)
    result = check_custom_resources([o for o in rendered if o["kind"] in CUSTOM_KINDS], f"helm-{tmp_path.name}")
    assert result.returncode == 0, result.stdout + result.stderr


def test_chart_renders_what_the_kustomize_base_builds() -> None:
    """Without a release label, in the base's (absent) namespace: the base's three cluster-wide objects exactly."""
    chart = [as_kustomize(o) for o in render({"releaseLabel": ""})]
    for obj in chart:
        del obj["metadata"]["namespace"]
    base = [o for o in build(KUBERNETES / "base") if o["kind"] != "Deployment"]
    assert sorted(chart, key=lambda o: o["kind"]) == sorted(base, key=lambda o: o["kind"])


def test_chart_renders_what_the_example_overlay_builds() -> None:
    values = {"releaseLabel": "kube-prometheus-stack", "dashboards": {"folder": "LLM serving"}}
    chart = [as_kustomize(o) for o in render(values, namespace="llm-serving")]
    overlay = [o for o in build(KUBERNETES / "overlays" / "example") if o["kind"] not in {"Deployment", "Namespace"}]
    assert sorted(chart, key=lambda o: o["kind"]) == sorted(overlay, key=lambda o: o["kind"])


def test_rules_and_dashboards_equal_their_sources(rendered: list[dict[str, Any]]) -> None:
    """Both sources hold Go-template braces (Prometheus's {{ $labels }}, Grafana's {{label}} legends):
    the chart embeds them as data, so they come out exactly as written."""
    source = RULES_FILE.read_text()
    assert "{{" in source and any("{{" in path.read_text() for path in DASHBOARDS)
    assert rules_of(rendered) == yaml.safe_load(source)["groups"]
    assert one(rendered, "ConfigMap")["data"] == {path.name: path.read_text() for path in DASHBOARDS}
    assert one(rendered, "ConfigMap")["metadata"]["labels"]["grafana_dashboard"] == "1"
    for kind in CUSTOM_KINDS:
        assert one(rendered, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_changed_values_change_exactly_their_sites() -> None:
    """Every alert value set to a new number, and a job selector and runbook: the rules differ from the
    rule file exactly where generate_manifests.RULE_VALUES says (and where --job-selector/--runbook-url would)."""
    defaults = generate_manifests.rule_defaults()
    changed = {alert: {key: number * 3 + 1 for key, number in keys.items()} for alert, keys in defaults.items()}
    selector, runbook = 'job="llm/vllm-modelkv"', "https://wiki.example.com/modelkv/runbook.md"
    values = {"prometheusRule": {"alerts": changed, "jobSelector": selector, "runbookUrl": runbook}}
    groups = rules_of(render(values))
    expected = generate_manifests.prometheus_rule(selector, runbook)["spec"]["groups"]
    assert groups == generate_manifests.apply_rule_values(expected, changed)

    only_numbers = rules_of(render({"prometheusRule": {"alerts": changed}}))
    original = yaml.safe_load(RULES_FILE.read_text())["groups"]
    differing = set()
    for group, new_group in zip(original, only_numbers, strict=True):
        for rule, new_rule in zip(group["rules"], new_group["rules"], strict=True):
            fields = {**rule, **rule.get("annotations", {}), "annotations": None}
            new_fields = {**new_rule, **new_rule.get("annotations", {}), "annotations": None}
            differing |= {(rule.get("alert"), f) for f in fields if fields[f] != new_fields[f]}
    sites = {(v.alert, s.field) for v in generate_manifests.RULE_VALUES for s in v.sites}
    assert differing == sites


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"prometheusRule": {"alerts": {"undeclaredMemoryGrowth": {"thresholdMiB": "256"}}}}, "thresholdMiB"),
        ({"prometheusRule": {"alerts": {"exporterDown": {"forMinutes": 0}}}}, "forMinutes"),
        ({"prometheusRule": {"alerts": {"exporterDown": {"forMinuts": 5}}}}, "forMinuts"),
        ({"podMonitr": {"enabled": False}}, "podMonitr"),
        ({"prometheusRule": {"jobSelector": "modelkv-exporter"}}, "jobSelector"),
        ({"prometheusRule": {"runbookUrl": "docs/runbook.md"}}, "runbookUrl"),
        ({"podMonitor": {"interval": "30 seconds"}}, "interval"),
    ],
    ids=["string-threshold", "zero-for", "unknown-alert-key", "unknown-key", "job-selector", "runbook", "duration"],
)
def test_wrong_values_are_refused_naming_them(values: dict[str, Any], named: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=named):
        render(values)


def test_values_file_is_valid_and_every_value_is_documented() -> None:
    chart = helm.Chart.load(CHART)
    assert chart.schema == generate_manifests.chart_schema()
    jsonschema.Draft7Validator.check_schema(chart.schema)
    jsonschema.validate(chart.values, chart.schema)
    table = generate_manifests.deploy_doc_text()
    for key in ("prometheusRule.alerts.undeclaredMemoryGrowth.thresholdMiB", "releaseLabel", "image.repository"):
        assert f"`{key}`" in table
