"""deploy/kubernetes: every overlay builds, validates offline, and agrees with the rules and dashboards."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from modelkv_testbed import ROOT
from modelkv_testbed.processes import require_tool
from modelkv_testbed.promql import DASHBOARDS, RULE_TESTS, RULES_FILE
from scripts.docgen import SETTINGS
from tests.support.typescript import run_tsc

KUBERNETES = ROOT / "deploy" / "kubernetes"
BUILDS = [KUBERNETES / "base", *sorted(p for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())]
# Native sidecars (initContainers with restartPolicy: Always) are on by default from 1.29.
SUPPORTED_VERSIONS = ("1.29.0", "1.31.0", "1.33.0", "1.35.0", "1.37.0")
CUSTOM_KINDS = {"PodMonitor", "PrometheusRule"}
MODELS = ROOT / "tests" / "k8s"

sys.path.insert(0, str(KUBERNETES))
import generate_manifests  # noqa: E402


def build(path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of one base or overlay, as objects."""
    result = subprocess.run([require_tool("kubectl"), "kustomize", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def check_custom_resources(resources: list[dict[str, Any]], name: str) -> subprocess.CompletedProcess[str]:
    """Type-check and validate() custom resources with @kubernetes-models/prometheus-operator (tsc, then node)."""
    models = MODELS / "node_modules" / "@kubernetes-models" / "prometheus-operator"
    if not models.is_dir():
        pytest.fail("npm packages missing: run the README's test command (npm ci --prefix tests/k8s)")
    lines = [
        f'import {{ {kind} }} from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/{kind}";'
        for kind in sorted(CUSTOM_KINDS | {r["kind"] for r in resources})
    ]
    for i, resource in enumerate(resources):
        body = {k: v for k, v in resource.items() if k not in {"apiVersion", "kind"}}
        lines += [
            f"const object{i} = new {resource['kind']}({json.dumps(body)});",
            f"if (object{i}.apiVersion !== {json.dumps(resource['apiVersion'])}) throw new Error('apiVersion');",
            f"object{i}.validate();",
        ]
    source = MODELS / f"{name}.ts"
    source.write_text("\n".join(lines) + "\n")
    try:
        tsc = run_tsc(MODELS / "node_modules", source, MODELS)
        if tsc.returncode != 0:
            return tsc
        runtime = source.with_suffix(".mjs")
        runtime.write_text("\n".join(lines) + "\n")
        try:
            return subprocess.run(["node", str(runtime)], capture_output=True, text=True, cwd=MODELS)
        finally:
            runtime.unlink()
    finally:
        source.unlink()


def assert_restricted(container: dict[str, Any]) -> None:
    """The container meets the restricted Pod Security Standard on its own (and is read-only besides)."""
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"] and security["seccompProfile"]["type"] == "RuntimeDefault"


@pytest.fixture(scope="module", params=BUILDS, ids=lambda p: p.name)
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return build(request.param)


def test_generated_base_files_are_current() -> None:
    for path, content in generate_manifests.expected_files().items():
        assert path.read_text() == content, f"{path.name} is stale: run python deploy/kubernetes/generate_manifests.py"


def test_core_objects_validate_strictly_against_every_supported_version(objects: list[dict[str, Any]]) -> None:
    core = [o for o in objects if o["kind"] not in CUSTOM_KINDS]
    assert {o["kind"] for o in core} - {"Namespace"} == {"Deployment", "ConfigMap"}
    for version in SUPPORTED_VERSIONS:
        for obj in core:
            kubernetes_validate.validate(obj, version, strict=True)
    broken = copy.deepcopy(one(objects, "Deployment"))
    broken["spec"]["template"]["spec"]["initContainers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SUPPORTED_VERSIONS[0], strict=True)


def test_custom_resources_match_prometheus_operator_models(objects: list[dict[str, Any]], tmp_path: Path) -> None:
    """Type-check each custom resource as an object literal against @kubernetes-models/prometheus-operator.

    TypeScript's excess-property check rejects any field the operator's CRDs do not define,
    and the models' validate() checks types and patterns (durations, enums) at run time.
    """
    custom = [o for o in objects if o["kind"] in CUSTOM_KINDS]
    assert {o["kind"] for o in custom} == CUSTOM_KINDS

    result = check_custom_resources(custom, f"check-{tmp_path.name}")
    assert result.returncode == 0, result.stdout + result.stderr

    wrong_field = copy.deepcopy(one(custom, "PodMonitor"))
    wrong_field["spec"]["podMetricsEndpoints"][0]["scrapeInterval"] = "30s"
    assert "scrapeInterval" in check_custom_resources([wrong_field], f"wrong-field-{tmp_path.name}").stdout
    wrong_value = copy.deepcopy(one(custom, "PrometheusRule"))
    (alerting,) = [g for g in wrong_value["spec"]["groups"] if g["name"] == "modelkv.alerts"]
    alerting["rules"][0]["for"] = "fifteen minutes"
    assert check_custom_resources([wrong_value], f"wrong-value-{tmp_path.name}").returncode != 0


def test_generating_with_the_placeholder_runbook_address_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Alerts whose runbook link resolves nowhere leave the person paged alone: the generator says so."""
    assert generate_manifests.main(["--output-dir", str(tmp_path / "default")]) == 0
    warned = capsys.readouterr().err
    assert warned.startswith("warning:") and generate_manifests.RUNBOOK_URL in warned and "--runbook-url" in warned
    url = "https://wiki.example.com/modelkv/runbook.md"
    assert generate_manifests.main(["--output-dir", str(tmp_path / "own"), "--runbook-url", url]) == 0
    assert "warning" not in capsys.readouterr().err
    assert (
        generate_manifests.main(["--output-dir", str(tmp_path / "other"), "--runbook-url", "https://x.invalid/r.md"])
        == 0
    )
    assert "https://x.invalid/r.md" in capsys.readouterr().err


@pytest.mark.slow
def test_the_job_selector_and_runbook_address_are_configurable(tmp_path: Path) -> None:
    """--job-selector and --runbook-url rewrite every selector and link; the rules still pass their unit tests."""
    selector, runbook = 'job="serving-modelkv"', "https://wiki.example.com/modelkv/runbook.md"
    out = tmp_path / "overlay"
    args = ["--output-dir", str(out), "--job-selector", selector, "--runbook-url", runbook]
    assert generate_manifests.main(args) == 0
    assert generate_manifests.main([*args, "--check"]) == 0
    rules_file = out / RULES_FILE.name
    text = rules_file.read_text()
    assert generate_manifests.JOB_SELECTOR not in text and generate_manifests.RUNBOOK_URL not in text
    assert text.count(selector) == RULES_FILE.read_text().count(generate_manifests.JOB_SELECTOR)
    rule = yaml.safe_load((out / "prometheusrule.yaml").read_text())
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert urls and all(url.startswith(runbook + "#") for url in urls)
    promtool = require_tool("promtool")
    checked = subprocess.run([promtool, "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (out / "tests").mkdir()
    for test_file in RULE_TESTS:
        content = test_file.read_text().replace('job="modelkv-exporter"', selector)
        content = content.replace("job: modelkv-exporter", "job: serving-modelkv")
        (out / "tests" / test_file.name).write_text(content.replace(generate_manifests.RUNBOOK_URL, runbook))
    tested = subprocess.run(
        [promtool, "test", "rules", *(t.name for t in RULE_TESTS)], capture_output=True, text=True, cwd=out / "tests"
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    with pytest.raises(ValueError):
        generate_manifests.rules_text(runbook_url="docs/runbook.md")

    base = os.path.relpath(KUBERNETES / "base", out)
    (out / "kustomization.yaml").write_text(f"resources: [{base}]\npatches:\n  - path: prometheusrule.yaml\n")
    (patched,) = [o for o in build(out) if o["kind"] == "PrometheusRule"]
    assert patched["spec"]["groups"] == rule["spec"]["groups"], "as a patch, it replaces the base's rules"


def test_prometheus_rule_and_dashboards_equal_their_sources(objects: list[dict[str, Any]]) -> None:
    rule = one(objects, "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]
    dashboards = one(objects, "ConfigMap")
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboards["data"] == {path.name: path.read_text() for path in DASHBOARDS}
    for content in dashboards["data"].values():
        assert json.loads(content)["uid"]


def test_sidecar_is_a_restricted_native_sidecar_sharing_the_spool(objects: list[dict[str, Any]]) -> None:
    pod = one(objects, "Deployment")["spec"]["template"]
    spec = pod["spec"]
    (sidecar,) = [c for c in spec["initContainers"] if c["name"] == "modelkv-exporter"]
    assert sidecar["restartPolicy"] == "Always"
    assert_restricted(sidecar)
    assert "readinessProbe" not in sidecar, "the exporter must never take the engine's pod out of service"
    assert sidecar["startupProbe"]["httpGet"]["path"] == sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    probe_port = next(s for s in SETTINGS if s.dest == "probe_port").defaults["serve"]
    for probe in ("startupProbe", "livenessProbe"):
        assert ports[sidecar[probe]["httpGet"]["port"]] == probe_port, "probes go to the liveness listener"
    assert {"cpu", "memory"} <= set(sidecar["resources"]["requests"]) and "memory" in sidecar["resources"]["limits"]

    spool_env = {e["name"]: e["value"] for e in sidecar["env"]}["MODELKV_SPOOL_DIR"]
    (mount,) = [m for m in sidecar["volumeMounts"] if m["mountPath"] == spool_env]
    assert mount["readOnly"] is True, "the sidecar never writes"
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory" and volume["emptyDir"]["sizeLimit"]
    engines = [c for c in spec["containers"] if any(m["name"] == mount["name"] for m in c.get("volumeMounts", []))]
    assert engines, "an engine shares the spool"
    for engine in engines:
        env = {e["name"]: e.get("value") for e in engine["env"]}
        engine_mount = next(m for m in engine["volumeMounts"] if m["name"] == mount["name"])
        assert env["MODELKV_SPOOL_DIR"] == engine_mount["mountPath"] and not engine_mount.get("readOnly")

    monitor = one(objects, "PodMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in sidecar["ports"]} and endpoint["path"] == "/metrics"
    job = next(r for r in endpoint["relabelings"] if r["targetLabel"] == "job")
    assert f'job="{job["replacement"]}"' in RULES_FILE.read_text(), "the rules select the job the PodMonitor sets"


def test_the_example_overlay_adds_the_release_label() -> None:
    objects = build(KUBERNETES / "overlays" / "example")
    for kind in CUSTOM_KINDS:
        assert one(objects, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == "llm-serving", "apply -k on a fresh cluster creates its namespace"
    assert {o["metadata"]["namespace"] for o in objects if o is not namespace} == {"llm-serving"}
    images = {c["image"] for c in one(objects, "Deployment")["spec"]["template"]["spec"]["initContainers"]}
    assert images == {"registry.example.com/modelkv-exporter:0.1.0"}
