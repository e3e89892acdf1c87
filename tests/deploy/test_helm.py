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
import httpx
import jsonschema
import kubernetes_validate
import pytest
import tomllib
import yaml

from modelkv_testbed import ROOT
from modelkv_testbed.polling import eventually
from modelkv_testbed.prometheus import running_prometheus
from modelkv_testbed.promql import DASHBOARDS, FLEET_GROUPS, RULES_FILE
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
from tests.deploy.test_sharded_prometheus import hashmod

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
        ({"serviceMonitor": {"enabled": "yes"}}, "enabled"),
        ({"serviceMonitor": {"enabled": True, "port": 9400}}, "port"),
        ({"podMonitor": {"nodeShards": 0}}, "nodeShards"),
    ],
    ids=[
        "string-threshold",
        "zero-for",
        "unknown-alert-key",
        "unknown-key",
        "job-selector",
        "runbook",
        "duration",
        "service-monitor-switch",
        "service-monitor-key",
        "no-shard",
    ],  # fmt: skip
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


def test_a_shard_and_the_fleet_prometheus_load_their_groups_and_together_all() -> None:
    everything = rules_of(render())
    names = [g["name"] for g in everything]
    shard_groups = [n for n in names if n not in FLEET_GROUPS]
    shard = rules_of(render({"prometheusRule": {"groups": shard_groups}}))
    fleet = rules_of(render({"prometheusRule": {"groups": list(FLEET_GROUPS)}}))
    assert [g["name"] for g in fleet] == list(FLEET_GROUPS)
    assert shard + fleet == everything
    with pytest.raises(helm.HelmValuesError, match="groups"):
        render({"prometheusRule": {"groups": ["modelkv.everything"]}})


def test_values_file_is_valid_and_every_value_is_documented() -> None:
    chart = helm.Chart.load(CHART)
    assert chart.schema == generate_manifests.chart_schema()
    jsonschema.Draft7Validator.check_schema(chart.schema)
    jsonschema.validate(chart.values, chart.schema)
    table = generate_manifests.deploy_doc_text()
    for key in ("prometheusRule.alerts.undeclaredMemoryGrowth.thresholdMiB", "releaseLabel", "image.repository"):
        assert f"`{key}`" in table


def notes(values: dict[str, Any]) -> str:
    """The chart's NOTES.txt as Helm prints it after an install with ``values``."""
    manifests = helm.Chart.load(CHART).render(values, name="modelkv", namespace="monitoring")
    return " ".join(manifests["modelkv-exporter/templates/NOTES.txt"].split())


def test_notes_warn_of_the_placeholder_runbook_and_the_namespace_scope() -> None:
    """The two pitfalls docs/deploy.md stresses, said where a person installing the chart reads: with the defaults
    every runbook link is the .invalid placeholder, and only the release's namespace is scraped."""
    default = notes({})
    assert (
        "WARNING: prometheusRule.runbookUrl is the placeholder https://modelkv-exporter.invalid/docs/runbook.md"
        in default
    )
    assert "--set prometheusRule.runbookUrl=" in default
    assert (
        "NOTE: podMonitor.namespaces is empty, so only engine pods in this release's namespace (monitoring)" in default
    )
    assert "--set 'podMonitor.namespaces={llm-a,llm-b}'" in default
    configured = notes({"prometheusRule": {"runbookUrl": "https://wiki.example.com/modelkv/runbook.md"},
                        "podMonitor": {"namespaces": ["llm-a", "llm-b"]}})  # fmt: skip
    assert "WARNING" not in configured and "NOTE" not in configured
    assert "Scraped namespaces: llm-a, llm-b (podMonitor.namespaces)" in configured
    assert "WARNING" in notes({"prometheusRule": {"runbookUrl": "http://docs.invalid:8080/runbook.md"}})
    assert "WARNING" not in notes({"prometheusRule": {"runbookUrl": "https://invalid.example.com/runbook.md"}})
    assert "WARNING" not in notes({"prometheusRule": {"enabled": False}}), "no rules, no runbook links"


def test_a_service_monitor_scrapes_as_the_pod_monitor_does(tmp_path: Path) -> None:
    """serviceMonitor.enabled with podMonitor off: a headless Service selecting the sidecar pods in each engine
    namespace, and a ServiceMonitor whose endpoint is the PodMonitor's (port, path, interval, job and container
    relabelings), valid for Kubernetes and prometheus-operator; both on would scrape twice and are refused."""
    namespaces = ["llm-a", "llm-b"]
    pod_monitor = one(render({"podMonitor": {"namespaces": namespaces}}), "PodMonitor")
    objects = render({"podMonitor": {"enabled": False, "namespaces": namespaces}, "serviceMonitor": {"enabled": True}})
    assert sorted(o["kind"] for o in objects) == ["ConfigMap", "PrometheusRule", "Service", "Service", "ServiceMonitor"]
    services = [o for o in objects if o["kind"] == "Service"]
    assert [s["metadata"]["namespace"] for s in services] == namespaces
    monitor = one(objects, "ServiceMonitor")
    for service in services:
        for version in SUPPORTED_VERSIONS:
            kubernetes_validate.validate(service, version, strict=True)
        assert service["spec"]["selector"] == pod_monitor["spec"]["selector"]["matchLabels"]
        assert service["spec"]["clusterIP"] == "None"
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == pod_monitor["spec"]["namespaceSelector"]
    assert monitor["spec"]["endpoints"] == pod_monitor["spec"]["podMetricsEndpoints"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    result = check_custom_resources([monitor, one(objects, "PrometheusRule")], f"helm-service-monitor-{tmp_path.name}")
    assert result.returncode == 0, result.stdout + result.stderr

    own = [
        o
        for o in render({"podMonitor": {"enabled": False}, "serviceMonitor": {"enabled": True}})
        if o["kind"] == "Service"
    ]
    assert [s["metadata"]["namespace"] for s in own] == ["monitoring"], "by default, the release's namespace"
    with pytest.raises(helm.HelmRenderError, match="set podMonitor.enabled=false to use the ServiceMonitor"):
        render({"serviceMonitor": {"enabled": True}})
    with pytest.raises(helm.HelmRenderError, match="podMonitor.job sets"):
        render({"podMonitor": {"enabled": False}, "serviceMonitor": {"enabled": True},
                "prometheusRule": {"jobSelector": 'job="other"'}})  # fmt: skip


def _growth_panel(dashboard: dict[str, Any]) -> dict[str, Any]:
    (panel,) = [p for p in dashboard["panels"] if p.get("title") == generate_manifests.GROWTH_PANEL]
    return panel


def test_the_growth_panel_draws_the_threshold_the_chart_alerts_at() -> None:
    """prometheusRule.alerts.undeclaredMemoryGrowth moves the dashboard's threshold line and the minutes its
    description states, and nothing else of any dashboard."""
    values = {"prometheusRule": {"alerts": {"undeclaredMemoryGrowth": {"thresholdMiB": 512, "forMinutes": 20}}}}
    data = one(render(values), "ConfigMap")["data"]
    assert set(data) == {path.name for path in DASHBOARDS}
    for path in DASHBOARDS:
        source, rendered = json.loads(path.read_text()), json.loads(data[path.name])
        panel = _growth_panel(rendered)
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert [s["value"] for s in steps] == [None, 512 * 1024 * 1024]
        assert "the alert fires after 20 minutes above it" in panel["description"]
        source_panel = _growth_panel(source)
        source_panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] = 512 * 1024 * 1024
        source_panel["description"] = source_panel["description"].replace("after 15 minutes", "after 20 minutes")
        assert rendered == source
    rule = next(
        r for g in rules_of(render(values)) for r in g["rules"] if r.get("alert") == "ModelKVUndeclaredMemoryGrowth"
    )
    assert "> 512 * 1024 * 1024" in rule["expr"] and rule["for"] == "20m", "the alert the line stands for"


def test_the_chart_dashboard_tokens_are_checked(tmp_path: Path) -> None:
    """The dashboard copy fails to generate, rather than silently keeping a fixed line, when the growth panel does
    not draw the alert's threshold exactly once."""
    path = DASHBOARDS[0]
    text = path.read_text()
    assert generate_manifests.GROWTH_THRESHOLD_TOKEN in generate_manifests.chart_dashboard_text(path)
    moved = tmp_path / path.name
    moved.write_text(text.replace('"value": 268435456', '"value": 268435457'))
    with pytest.raises(ValueError, match="does not draw the alert's threshold"):
        generate_manifests.chart_dashboard_text(moved)


def test_notes_tell_how_to_add_the_sidecar_with_the_image() -> None:
    image = {"repository": "registry.example.com/modelkv-exporter", "tag": "0.1.1"}
    manifests = helm.Chart.load(CHART).render({"image": image}, name="modelkv", namespace="monitoring")
    notes = manifests["modelkv-exporter/templates/NOTES.txt"]
    assert "--image=registry.example.com/modelkv-exporter:0.1.1" in notes and "modelkv-sidecar.py" in notes


IMAGE = "registry.example.com/modelkv-exporter:0.1.0"
"""The sidecar image the tests pass: the post-renderer refuses to run without one."""


def post_render(manifests: str, *args: str, image: str | None = IMAGE) -> subprocess.CompletedProcess[str]:
    """The post-renderer as Helm runs it: manifests on stdin, patched manifests on stdout; ``--image`` unless
    ``image`` is None."""
    command = [sys.executable, str(POST_RENDERER), *args, *(["--image", image] if image else [])]
    return subprocess.run(command, input=manifests, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("shape", "selector"),
    [("production-stack.yaml", "model=llama3,helm-release-name=vllm"), ("vllm-example-chart.yaml", "release=test")],
)
def test_post_renderer_adds_the_sidecar(shape: str, selector: str, rendered: list[dict[str, Any]]) -> None:
    manifests = (ENGINE_CHARTS / shape).read_text()
    result = post_render(manifests, "--selector", selector)
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
    assert sidecar == {**parts["initContainer"], "image": IMAGE}
    assert sidecar["restartPolicy"] == "Always" and spec["initContainers"][-1] is sidecar
    assert_restricted(sidecar)
    assert {p["name"] for p in sidecar["ports"]} == {"modelkv-metrics", "modelkv-probe"}
    assert parts["volume"] in spec["volumes"]
    (engine,) = spec["containers"]
    assert parts["engineEnv"][0] in engine["env"] and parts["engineVolumeMount"] in engine["volumeMounts"]
    old_engine = before[engine_index]["spec"]["template"]["spec"]["containers"][0]
    plugins = [e for e in old_engine["env"] if e["name"] == "VLLM_PLUGINS"]
    if plugins:  # production-stack's LoRA resolver: vLLM loads only the plugins VLLM_PLUGINS names
        plugins[0]["value"] += ",modelkv_exporter"
    assert engine["env"][: len(old_engine["env"])] == old_engine["env"], "the engine keeps its own settings"
    name = before[engine_index]["metadata"]["name"]
    report = [line for line in result.stderr.splitlines() if line.startswith("modelkv-sidecar: ")]
    assert len(report) == 1 and report[0].startswith(f"modelkv-sidecar: Deployment/{name}: added the modelkv-exporter "
                                                     "sidecar (registry.example.com/modelkv-exporter:0.1.0)")  # fmt: skip
    assert ("VLLM_PLUGINS 'lora_filesystem_resolver' -> 'lora_filesystem_resolver,modelkv_exporter'" in report[0]) == (
        bool(plugins)
    ), "what changed is said on standard error"
    monitor = one(rendered, "PodMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()

    again = post_render(result.stdout, "--selector", selector)
    assert again.returncode == 0 and [d for d in yaml.safe_load_all(again.stdout) if d] == after, "idempotent"
    assert (
        again.stderr == f"modelkv-sidecar: Deployment/{name}: unchanged, it already has the modelkv-exporter sidecar\n"
    )


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
    image = base["spec"]["template"]["spec"]["initContainers"][0]["image"]
    result = post_render(yaml.safe_dump(bare), "--selector", "app.kubernetes.io/name=vllm-omni", image=image)
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
        (
            ["--selector", "model=nothing-here"],
            "no Deployment, StatefulSet, LeaderWorkerSet is labelled model=nothing-here",
        ),
        (["--selector", "release=test", "--container", "engine"], "no container named engine"),
        (["--selector", "release"], "is not key=value"),
    ],
)
def test_post_renderer_refuses_what_it_cannot_do(args: list[str], message: str) -> None:
    result = post_render((ENGINE_CHARTS / "vllm-example-chart.yaml").read_text(), *args)
    assert result.returncode == 1 and message in result.stderr and result.stdout == ""


def _pod(template: dict[str, Any]) -> dict[str, Any]:
    """A pod template as the Pod it makes, for Kubernetes' own schema."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": template.get("metadata", {}), "spec": template["spec"]}


def _env(container: dict[str, Any], name: str) -> str | None:
    values = [e.get("value") for e in container.get("env") or [] if e["name"] == name]
    return values[0] if values else None


def test_post_renderer_adds_the_sidecar_to_every_pod_of_a_leader_worker_set() -> None:
    """llm-d's shape: decode as a LeaderWorkerSet with one template (its leader's too) behind llm-d's own native
    sidecar, prefill as one with a leader and a worker template, an InferencePool with the same labels.

    Every template gets the sidecar, the spool and MODELKV_SPOOL_DIR (each pod runs vLLM workers, which
    publish); VLLM_PLUGINS gets this plugin: ``lora_filesystem_resolver`` becomes
    ``lora_filesystem_resolver,modelkv_exporter``, and an empty one, with which vLLM loads no plugin, becomes
    ``modelkv_exporter``. The InferencePool and the endpoint picker pass through; standard error says what changed
    per template.
    """
    manifests = (ENGINE_CHARTS / "llm-d.yaml").read_text()
    result = post_render(manifests, "--selector", "llm-d.ai/model=deepseek-r1")
    assert result.returncode == 0, result.stderr
    before = [d for d in yaml.safe_load_all(manifests) if d]
    after = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = [d["kind"] for d in after]
    assert kinds == ["InferencePool", "Deployment", "LeaderWorkerSet", "LeaderWorkerSet"]
    assert after[:2] == before[:2], "what holds no engine passes through"
    parts = generate_manifests.sidecar_parts()
    decode, prefill = after[2]["spec"]["leaderWorkerTemplate"], after[3]["spec"]["leaderWorkerTemplate"]
    assert "leaderTemplate" not in decode, "a leader template is not invented: the workers' serves the leader"
    templates = {
        "decode": decode["workerTemplate"],
        "prefill leader": prefill["leaderTemplate"],
        "prefill worker": prefill["workerTemplate"],
    }
    expected_plugins = {
        "decode": "modelkv_exporter",
        "prefill leader": "lora_filesystem_resolver,modelkv_exporter",
        "prefill worker": "lora_filesystem_resolver,modelkv_exporter",
    }
    for label, template in templates.items():
        for version in SUPPORTED_VERSIONS:
            kubernetes_validate.validate(_pod(template), version, strict=True)
        spec = template["spec"]
        assert spec["initContainers"][-1] == {**parts["initContainer"], "image": IMAGE}, label
        assert parts["volume"] in spec["volumes"], label
        assert parts["podLabels"].items() <= template["metadata"]["labels"].items(), label
        (engine,) = spec["containers"]
        assert _env(engine, "MODELKV_SPOOL_DIR") == "/var/run/modelkv", label
        assert parts["engineVolumeMount"] in engine["volumeMounts"], label
        assert _env(engine, "VLLM_PLUGINS") == expected_plugins[label], label
        assert "modelkv_exporter" in _env(engine, "VLLM_PLUGINS").split(","), "as vLLM splits it: on commas alone"
    routing = decode["workerTemplate"]["spec"]["initContainers"][0]
    assert routing["name"] == "routing-proxy" and routing["restartPolicy"] == "Always", "llm-d's sidecar is kept"

    report = result.stderr.splitlines()
    assert len(report) == 3, report
    assert report[0].startswith("modelkv-sidecar: LeaderWorkerSet/ms-r1-llm-d-modelservice-decode: added ")
    assert "MODELKV_SPOOL_DIR in vllm; VLLM_PLUGINS '' -> 'modelkv_exporter' (empty: vLLM loaded no plugin" in report[0]
    assert report[1].startswith("modelkv-sidecar: LeaderWorkerSet/ms-r1-llm-d-modelservice-prefill leaderTemplate: ")
    assert report[2].startswith("modelkv-sidecar: LeaderWorkerSet/ms-r1-llm-d-modelservice-prefill workerTemplate: ")
    assert "MODELKV_SPOOL_DIR in vllm-worker; VLLM_PLUGINS 'lora_filesystem_resolver' -> " in report[2]

    again = post_render(result.stdout, "--selector", "llm-d.ai/model=deepseek-r1")
    assert again.returncode == 0 and [d for d in yaml.safe_load_all(again.stdout) if d] == after, "idempotent"
    named = post_render(manifests, "--selector", "llm-d.ai/role=prefill", "--container", "vllm-leader")
    assert named.returncode == 1 and "workerTemplate: no container named vllm-leader" in named.stderr


def test_the_plugin_it_adds_is_the_one_the_package_registers() -> None:
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert list(entry_points["vllm.general_plugins"]) == ["modelkv_exporter"]


def _example_engine(env: list[dict[str, Any]]) -> str:
    """vLLM's example chart with the engine container's ``env`` replaced."""
    documents = [d for d in yaml.safe_load_all((ENGINE_CHARTS / "vllm-example-chart.yaml").read_text()) if d]
    documents[0]["spec"]["template"]["spec"]["containers"][0]["env"] = env
    return yaml.safe_dump_all(documents)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ([], None),
        ([{"name": "VLLM_PLUGINS", "value": "lora_filesystem_resolver"}], "lora_filesystem_resolver,modelkv_exporter"),
        ([{"name": "VLLM_PLUGINS", "value": ""}], "modelkv_exporter"),
        ([{"name": "VLLM_PLUGINS"}], "modelkv_exporter"),
        ([{"name": "VLLM_PLUGINS", "value": "a,modelkv_exporter"}], "a,modelkv_exporter"),
        ([{"name": "VLLM_PLUGINS", "value": "a, modelkv_exporter"}], "a, modelkv_exporter,modelkv_exporter"),
    ],
    ids=["unset-stays-unset", "a-list-gains-it", "empty-loads-ours", "no-value-is-empty", "listed", "spaced-is-not"],
)
def test_post_renderer_puts_the_plugin_in_vllm_plugins(env: list[dict[str, Any]], expected: str | None) -> None:
    """vLLM reads VLLM_PLUGINS as ``value.split(",")`` and loads a plugin only when its name is an item: unset loads
    all (left unset), empty loads none, and `` modelkv_exporter`` with a space is not the name."""
    result = post_render(_example_engine(env), "--selector", "release=test")
    assert result.returncode == 0, result.stderr
    (engine,) = yaml.safe_load(result.stdout)["spec"]["template"]["spec"]["containers"]
    assert _env(engine, "VLLM_PLUGINS") == expected
    assert ("VLLM_PLUGINS" in result.stderr) == (expected is not None and env[0].get("value") != expected)


def test_post_renderer_refuses_a_vllm_plugins_it_cannot_see() -> None:
    from_map = {"name": "VLLM_PLUGINS", "valueFrom": {"configMapKeyRef": {"name": "engine", "key": "plugins"}}}
    result = post_render(_example_engine([from_map]), "--selector", "release=test")
    assert result.returncode == 1 and result.stdout == ""
    assert "VLLM_PLUGINS comes from valueFrom, which this cannot change: add modelkv_exporter to it" in result.stderr
    documents = [d for d in yaml.safe_load_all((ENGINE_CHARTS / "vllm-example-chart.yaml").read_text()) if d]
    documents[0]["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "engine"}}]
    noted = post_render(yaml.safe_dump_all(documents), "--selector", "release=test")
    assert (
        noted.returncode == 0 and "note: envFrom may set VLLM_PLUGINS; if it does, add modelkv_exporter" in noted.stderr
    )


@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        (("batch/v1", "Job"), {"template": {"spec": {"containers": [{"name": "vllm", "image": "v"}]}}}),
        (("argoproj.io/v1alpha1", "Rollout"), {"template": {"spec": {"containers": [{"name": "vllm", "image": "v"}]}}}),
        (("v1", "Pod"), {"containers": [{"name": "vllm", "image": "v"}]}),
    ],
    ids=["job", "rollout", "pod"],
)
def test_post_renderer_refuses_a_kind_it_does_not_know(kind: tuple[str, str], spec: dict[str, Any]) -> None:
    """A matching object that runs containers but is no kind it patches would run without the sidecar: refused, by
    name, with what to do; the same object with other labels passes through."""
    extra = {"apiVersion": kind[0], "kind": kind[1], "metadata": {"name": "engine-x", "labels": {"release": "test"}}}
    manifests = (
        (ENGINE_CHARTS / "vllm-example-chart.yaml").read_text() + "---\n" + yaml.safe_dump({**extra, "spec": spec})
    )
    result = post_render(manifests, "--selector", "release=test")
    assert result.returncode == 1 and result.stdout == ""
    assert (
        f"modelkv-sidecar: {kind[1]}/engine-x ({kind[0]}) matches the selector and runs containers, but only "
        in result.stderr
    )
    assert "Deployment, StatefulSet, LeaderWorkerSet are patched: narrow --selector" in result.stderr
    extra["metadata"]["labels"] = {"release": "other"}
    other = (ENGINE_CHARTS / "vllm-example-chart.yaml").read_text() + "---\n" + yaml.safe_dump({**extra, "spec": spec})
    assert post_render(other, "--selector", "release=test").returncode == 0


def shard_relabelings(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The PodMonitor's relabelings with ``values``, after the two every release has (job, container)."""
    monitor = one(render({"podMonitor": values}), "PodMonitor")
    return monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][2:]


def test_one_shard_keeps_every_pod_as_the_kustomize_base_does() -> None:
    assert shard_relabelings({}) == [] == shard_relabelings({"nodeShards": 1, "nodeShard": 0})


def test_node_shards_split_the_pods_by_node_on_real_prometheus(tmp_path: Path) -> None:
    """Each shard's release keeps the pods of its nodes on Prometheus itself: together all, apart none, and the
    same split as the hashmod the sharded stories are evaluated with (tests/deploy/test_sharded_prometheus.py)."""
    shards, nodes = 3, [f"gpu-node-{n}" for n in range(24)]
    snake = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    jobs = ""
    for shard in range(shards):
        objects = render({"podMonitor": {"nodeShards": shards, "nodeShard": shard}})
        result = check_custom_resources([one(objects, "PodMonitor")], f"helm-shard-{shard}-{tmp_path.name}")
        assert result.returncode == 0, result.stdout + result.stderr
        relabel = [
            {snake.get(k, k): v for k, v in r.items()}
            for r in shard_relabelings({"nodeShards": shards, "nodeShard": shard})
        ]
        assert [r["action"] for r in relabel] == ["hashmod", "keep"]
        targets = [
            {"targets": [f"127.0.0.1:{1000 + n}"], "labels": {"node": name, "__meta_kubernetes_pod_node_name": name}}
            for n, name in enumerate(nodes)
        ]
        job = {"job_name": f"shard-{shard}", "static_configs": targets, "relabel_configs": relabel}
        jobs += "  - " + json.dumps(job) + "\n"
    config = "global: {scrape_interval: 1h}\nscrape_configs:\n" + jobs
    with running_prometheus(tmp_path, config) as url:

        def discovered() -> dict[str, Any]:
            data = httpx.get(url + "/api/v1/targets", timeout=10).json()["data"]
            return data if len(data["activeTargets"]) + len(data["droppedTargets"]) == shards * len(nodes) else {}

        data = eventually(discovered, "Prometheus to relabel every shard's targets")
    kept: dict[int, set[str]] = {shard: set() for shard in range(shards)}
    for target in data["activeTargets"]:
        kept[int(target["scrapePool"].removeprefix("shard-"))].add(target["labels"]["node"])
    assert set().union(*kept.values()) == set(nodes), "every node's pods are scraped by a shard"
    assert sum(len(k) for k in kept.values()) == len(nodes), "by one shard only"
    assert kept == {shard: {n for n in nodes if hashmod(n, shards) == shard} for shard in range(shards)}
    assert all(kept.values()), "24 nodes reach every one of 3 shards"


def test_a_shard_past_the_last_is_refused_naming_the_range() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"nodeShard is 2, but the shards are numbered 0 to 1"):
        render({"podMonitor": {"nodeShards": 2, "nodeShard": 2}})


def test_the_service_monitor_keeps_the_same_shard() -> None:
    values = {"podMonitor": {"enabled": False, "nodeShards": 2, "nodeShard": 1}, "serviceMonitor": {"enabled": True}}
    monitor = one(render(values), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["relabelings"][2:] == shard_relabelings({"nodeShards": 2, "nodeShard": 1})
