"""deploy/helm: the chart renders and lints with Helm's own engine, agrees with the kustomize base and the rule
file, refuses wrong values; the post-renderer adds the base's sidecar to engine charts' Deployments."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
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
    assert_restricted,
    build,
    check_custom_resources,
    generate_manifests,
    one,
)
from tests.support import ROOT
from tests.support.promql import DASHBOARDS, RULES_FILE

CHART = ROOT / "deploy" / "helm" / "modelkv-exporter"
POST_RENDERER = ROOT / "deploy" / "helm" / "post-renderer" / "modelkv-sidecar.py"
ENGINE_CHARTS = Path(__file__).parent / "engine_charts"
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
    objects = [manifests[path] for path in manifests if not path.endswith("/NOTES.txt")]
    return [doc for text in objects for doc in yaml.safe_load_all(text) if doc]


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


def test_the_pod_monitor_looks_in_the_engines_namespaces(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    assert "namespaceSelector" not in one(rendered, "PodMonitor")["spec"], "by default, the release's namespace"
    monitor = one(render({"podMonitor": {"namespaces": ["llm-a", "llm-b"]}}), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["llm-a", "llm-b"]}
    result = check_custom_resources([monitor], f"helm-namespaces-{tmp_path.name}")
    assert result.returncode == 0, result.stdout + result.stderr


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
    values = {
        "prometheusRule": {"alerts": changed, "jobSelector": selector, "runbookUrl": runbook},
        "podMonitor": {"job": "llm/vllm-modelkv"},
    }
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


def test_a_job_selector_that_misses_the_pod_monitors_job_is_refused() -> None:
    with pytest.raises(
        helm.HelmRenderError, match='selects job="other", but podMonitor.job sets job="modelkv-exporter"'
    ):
        render({"prometheusRule": {"jobSelector": 'job="other"'}})
    both = {"prometheusRule": {"jobSelector": 'job="other"'}, "podMonitor": {"job": "other"}}
    assert 'up{job="other"}' in str(rules_of(render(both)))
    regex = rules_of(render({"prometheusRule": {"jobSelector": 'job=~"modelkv-.*"'}}))
    assert 'up{job=~"modelkv-.*"}' in str(regex), "a regular expression is the user's to check"


def test_values_file_is_valid_and_every_value_is_documented() -> None:
    chart = helm.Chart.load(CHART)
    assert chart.schema == generate_manifests.chart_schema()
    jsonschema.Draft7Validator.check_schema(chart.schema)
    jsonschema.validate(chart.values, chart.schema)
    table = generate_manifests.deploy_doc_text()
    for key in ("prometheusRule.alerts.undeclaredMemoryGrowth.thresholdMiB", "releaseLabel", "image.repository"):
        assert f"`{key}`" in table


def test_notes_tell_how_to_add_the_sidecar_with_the_image() -> None:
    image = {"repository": "registry.example.com/modelkv-exporter", "tag": "0.1.1"}
    manifests = helm.Chart.load(CHART).render({"image": image}, name="modelkv", namespace="monitoring")
    notes = manifests["modelkv-exporter/templates/NOTES.txt"]
    assert "--image=registry.example.com/modelkv-exporter:0.1.1" in notes and "modelkv-sidecar.py" in notes


def post_render(manifests: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The post-renderer as Helm runs it: manifests on stdin, patched manifests on stdout."""
    return subprocess.run([sys.executable, str(POST_RENDERER), *args], input=manifests, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("shape", "selector"),
    [("production-stack.yaml", "model=llama3,helm-release-name=vllm"), ("vllm-example-chart.yaml", "release=test")],
)
def test_post_renderer_adds_the_sidecar(shape: str, selector: str, rendered: list[dict[str, Any]]) -> None:
    manifests = (ENGINE_CHARTS / shape).read_text()
    result = post_render(manifests, "--selector", selector, "--image", "registry.example.com/modelkv-exporter:0.1.0")
    assert result.returncode == 0, result.stderr
    before = [d for d in yaml.safe_load_all(manifests) if d]
    after = [d for d in yaml.safe_load_all(result.stdout) if d]
    parts = generate_manifests.sidecar_parts()
    (engine_index,) = [i for i, d in enumerate(before) if d["metadata"]["name"].endswith("-deployment-vllm")]
    assert [d for i, d in enumerate(after) if i != engine_index] == [
        d for i, d in enumerate(before) if i != engine_index
    ], "only the selected workload changes"
    workload = after[engine_index]
    for version in SUPPORTED_VERSIONS:
        kubernetes_validate.validate(workload, version, strict=True)
    pod = workload["spec"]["template"]
    spec = pod["spec"]
    (sidecar,) = [c for c in spec["initContainers"] if c["name"] == parts["initContainer"]["name"]]
    assert sidecar == {**parts["initContainer"], "image": "registry.example.com/modelkv-exporter:0.1.0"}
    assert sidecar["restartPolicy"] == "Always" and spec["initContainers"][-1] is sidecar
    assert_restricted(sidecar)
    assert {p["name"] for p in sidecar["ports"]} == {"modelkv-metrics", "modelkv-probe"}
    assert parts["volume"] in spec["volumes"]
    (engine,) = spec["containers"]
    assert parts["engineEnv"][0] in engine["env"] and parts["engineVolumeMount"] in engine["volumeMounts"]
    old_engine = before[engine_index]["spec"]["template"]["spec"]["containers"][0]
    assert engine["env"][: len(old_engine["env"])] == old_engine["env"], "the engine keeps its own settings"
    monitor = one(rendered, "PodMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()

    again = post_render(result.stdout, "--selector", selector)
    assert again.returncode == 0 and [d for d in yaml.safe_load_all(again.stdout) if d] == after, "idempotent"


def test_post_renderer_rebuilds_the_base_deployment() -> None:
    """The base's example Deployment stripped of the sidecar and given back to the post-renderer is the base again."""
    base = yaml.safe_load((KUBERNETES / "base" / "deployment.yaml").read_text())
    bare = copy.deepcopy(base)
    spec = bare["spec"]["template"]["spec"]
    del spec["initContainers"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "modelkv-spool"]
    engine = spec["containers"][0]
    engine["env"] = [e for e in engine["env"] if e["name"] != "MODELKV_SPOOL_DIR"]
    engine["volumeMounts"] = [m for m in engine["volumeMounts"] if m["name"] != "modelkv-spool"]
    del bare["spec"]["template"]["metadata"]["labels"]["modelkv-exporter/scrape"]
    result = post_render(yaml.safe_dump(bare), "--selector", "app.kubernetes.io/name=vllm-omni")
    assert result.returncode == 0, result.stderr
    rebuilt = yaml.safe_load(result.stdout)
    rebuilt_engine = rebuilt["spec"]["template"]["spec"]["containers"][0]
    base_engine = base["spec"]["template"]["spec"]["containers"][0]
    # The base lists the spool first; the post-renderer appends. Same sets, otherwise the same object.
    for field in ("env", "volumeMounts"):
        assert sorted(json.dumps(x, sort_keys=True) for x in rebuilt_engine.pop(field)) == sorted(
            json.dumps(x, sort_keys=True) for x in base_engine.pop(field)
        )
    rebuilt["spec"]["template"]["spec"]["volumes"].sort(key=lambda v: v["name"])
    base["spec"]["template"]["spec"]["volumes"].sort(key=lambda v: v["name"])
    assert rebuilt == base


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--selector", "model=nothing-here"], "no Deployment or StatefulSet is labelled model=nothing-here"),
        (["--selector", "release=test", "--container", "engine"], "no container named engine"),
        (["--selector", "release"], "is not key=value"),
    ],
)
def test_post_renderer_refuses_what_it_cannot_do(args: list[str], message: str) -> None:
    result = post_render((ENGINE_CHARTS / "vllm-example-chart.yaml").read_text(), *args)
    assert result.returncode == 1 and message in result.stderr and result.stdout == ""
