#!/usr/bin/env python3
"""Helm post-renderer: add modelkv-exporter's native sidecar to the engine pods another chart renders.

Helm passes every rendered manifest on stdin; this writes them back on stdout, with each workload whose
labels match ``--selector`` given, from ``sidecar.yaml`` beside this file (generated from
deploy/kubernetes/base/deployment.yaml, so the kustomize base and this add the same sidecar):

- the sidecar as an init container with ``restartPolicy: Always`` (a native sidecar, Kubernetes >= 1.29),
  with its metrics and probe ports and its restricted security context;
- the spool, an in-memory ``emptyDir``;
- in each engine container (``--container``, else every container), ``MODELKV_SPOOL_DIR`` and the spool's mount,
  and ``modelkv_exporter`` added to a ``VLLM_PLUGINS`` the container sets (vLLM then loads only the plugins it
  names: without ours, the hook would never run). An unset ``VLLM_PLUGINS`` is left unset (vLLM loads every
  plugin); an empty one (vLLM loads none) becomes ``modelkv_exporter``;
- the pod label the chart's PodMonitor selects.

The workloads it patches are Deployments and StatefulSets (their pod template) and LeaderWorkerSets, which
multi-node vLLM (llm-d, vLLM's LWS example) runs engines in: the leader's and the workers' templates, since
every pod of the group runs vLLM workers. Any other object the selector matches that holds containers (a
Job, a DaemonSet, an Argo Rollout, a bare Pod) is refused by name, never passed through unpatched in
silence. Everything else passes through unchanged. What it changed, workload by workload, is written to
standard error. A workload that already has the sidecar is left as it is, so running it twice changes
nothing. It fails when the selector matches no workload. It refuses to run without ``--image`` (or
``$MODELKV_EXPORTER_IMAGE``), with status 2: ``sidecar.yaml``'s image is the base's placeholder, which no
registry serves, and a native sidecar whose image cannot be pulled keeps the engine container from ever
starting. Needs Python 3.9+ and PyYAML.

    helm install vllm vllm/vllm-stack -f my-values.yaml \\
        --post-renderer ./deploy/helm/post-renderer/modelkv-sidecar.py \\
        --post-renderer-args=--selector=helm-release-name=vllm \\
        --post-renderer-args=--image=registry.example.com/modelkv-exporter:0.1.0
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path
from typing import Any

try:
    import yaml
except ImportError:
    raise SystemExit(
        "modelkv-sidecar.py needs PyYAML in the Python that Helm runs it with: pip install pyyaml "
        "(in a checkout of modelkv-exporter: pip install '.[deploy]')"
    ) from None

PARTS = Path(__file__).resolve().parent / "sidecar.yaml"
PLUGIN = "modelkv_exporter"
"""The name of this project's vLLM plugin (its ``vllm.general_plugins`` entry point)."""
PLUGINS_VARIABLE = "VLLM_PLUGINS"
LEADER_WORKER_SET = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
TEMPLATES = {
    ("apps/v1", "Deployment"): (("spec", "template"),),
    ("apps/v1", "StatefulSet"): (("spec", "template"),),
    LEADER_WORKER_SET: (
        ("spec", "leaderWorkerTemplate", "leaderTemplate"),
        ("spec", "leaderWorkerTemplate", "workerTemplate"),
    ),
}
"""Where each workload kind it patches keeps its pod templates (a LeaderWorkerSet's leader template is optional)."""
KNOWN = ", ".join(kind for _, kind in TEMPLATES)
MISSING_IMAGE = (
    "give --image (or set MODELKV_EXPORTER_IMAGE) to the sidecar image your cluster pulls, e.g. "
    "--post-renderer-args=--image=registry.example.com/modelkv-exporter:0.1.0: the image in sidecar.yaml is a "
    "placeholder no registry serves, and a native sidecar that cannot be pulled keeps the engine from starting"
)


def parse_selector(text: str) -> dict[str, str]:
    """``a=b,c=d`` (equality only, as ``kubectl -l`` writes it) as a mapping."""
    selector = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = term.partition("=")
        if not sep or not key or "!" in key:
            raise ValueError(f"selector term {term!r} is not key=value")
        selector[key.strip()] = value.strip().lstrip("=")
    if not selector:
        raise ValueError("the selector is empty")
    return selector


def _kind(document: dict[str, Any]) -> tuple[Any, Any]:
    return document.get("apiVersion"), document.get("kind")


def _name(document: dict[str, Any]) -> str:
    return f"{document.get('kind', '?')}/{(document.get('metadata') or {}).get('name', '?')}"


def matches(document: Any, selector: dict[str, str]) -> bool:
    """Whether ``document`` is an object whose labels include ``selector``."""
    if not isinstance(document, dict):
        return False
    labels = (document.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def holds_containers(node: Any) -> bool:
    """Whether ``node`` has a pod spec somewhere in it (a ``containers`` list)."""
    if isinstance(node, dict):
        return isinstance(node.get("containers"), list) or any(holds_containers(v) for v in node.values())
    if isinstance(node, list):
        return any(holds_containers(v) for v in node)
    return False


def selected(document: Any, selector: dict[str, str]) -> bool:
    """Whether ``document`` is a workload this patches and its labels include ``selector``.

    Raises ``ValueError`` for a matching object of another kind that holds containers: its pods would get no
    sidecar, and the user would not know.
    """
    if not matches(document, selector):
        return False
    if _kind(document) in TEMPLATES:
        return True
    if holds_containers(document.get("spec")):
        api, kind = _kind(document)
        raise ValueError(
            f"{_name(document)} ({api}) matches the selector and runs containers, but only {KNOWN} are patched: "
            "narrow --selector to leave it out, or add the sidecar to it by hand (docs/deploy.md)"
        )
    return False


def _plugins(engine: dict[str, Any], where: str, changes: list[str]) -> None:
    """Add this plugin to the container's ``VLLM_PLUGINS``, if it sets one; note what changed in ``changes``."""
    for variable in engine.get("env") or []:
        if variable.get("name") != PLUGINS_VARIABLE:
            continue
        if "valueFrom" in variable:
            raise ValueError(
                f"{where}: {PLUGINS_VARIABLE} comes from valueFrom, which this cannot change: add {PLUGIN} to it "
                "where it is defined, or vLLM never loads the hook"
            )
        value = str(variable.get("value") or "")
        if PLUGIN in value.split(","):
            return
        new = f"{value},{PLUGIN}" if value else PLUGIN
        why = " (empty: vLLM loaded no plugin; now it loads this one only)" if not value else ""
        variable["value"] = new
        changes.append(f"{PLUGINS_VARIABLE} {value!r} -> {new!r}{why}")
        return
    if engine.get("envFrom"):
        changes.append(
            f"note: envFrom may set {PLUGINS_VARIABLE}; if it does, add {PLUGIN} to it, or vLLM never loads the hook"
        )


def _patch_pod(
    template: dict[str, Any], parts: dict[str, Any], containers: list[str], sidecar: dict[str, Any], where: str
) -> tuple[list[str], list[str]]:
    """Add the sidecar to one pod template in place; the engine containers' names, and what changed."""
    spec = template["spec"]
    template.setdefault("metadata", {})
    template["metadata"]["labels"] = {**(template["metadata"].get("labels") or {}), **parts["podLabels"]}
    spec["initContainers"] = [*(spec.get("initContainers") or []), copy.deepcopy(sidecar)]
    volume = parts["volume"]
    if any(v.get("name") == volume["name"] for v in spec.get("volumes") or []):
        raise ValueError(f"{where}: a volume is already named {volume['name']}")
    spec["volumes"] = [*(spec.get("volumes") or []), copy.deepcopy(volume)]
    engines = [c for c in spec["containers"] if not containers or c["name"] in containers]
    if not engines:
        raise ValueError(f"{where}: no container named {', '.join(containers)}")
    changes: list[str] = []
    for engine in engines:
        at = f"{where}/{engine['name']}"
        env = engine.get("env") or []
        for variable in parts["engineEnv"]:
            present = [e for e in env if e.get("name") == variable["name"]]
            if present and present[0] != variable:
                raise ValueError(f"{at}: {variable['name']} is set to something else")
            if not present:
                env = [*env, copy.deepcopy(variable)]
        engine["env"] = env
        mount = parts["engineVolumeMount"]
        mounts = engine.get("volumeMounts") or []
        if any(m.get("mountPath") == mount["mountPath"] for m in mounts):
            raise ValueError(f"{at}: something is already mounted at {mount['mountPath']}")
        engine["volumeMounts"] = [*mounts, copy.deepcopy(mount)]
        _plugins(engine, at, changes)
    return [e["name"] for e in engines], changes


def add_sidecar(
    workload: dict[str, Any],
    parts: dict[str, Any],
    containers: list[str],
    image: str | None = None,
    report: list[str] | None = None,
) -> dict[str, Any]:
    """A copy of ``workload`` with the sidecar, the spool and the engines' settings added to each of its pod
    templates; a line per template in ``report`` saying what changed."""
    workload = copy.deepcopy(workload)
    report = [] if report is None else report
    sidecar = copy.deepcopy(parts["initContainer"])
    if image:
        sidecar["image"] = image
    name = _name(workload)
    templates = []
    for path in TEMPLATES[_kind(workload)]:
        node: Any = workload
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            templates.append((path[-1], node))
    if not templates:
        raise ValueError(f"{name}: no pod template at {'.'.join(TEMPLATES[_kind(workload)][-1])}")
    if any(c.get("name") == sidecar["name"] for _, t in templates for c in t["spec"].get("initContainers") or []):
        report.append(f"{name}: unchanged, it already has the {sidecar['name']} sidecar")
        return workload
    found = set()
    for label, template in templates:
        where = name if len(templates) == 1 else f"{name} {label}"
        names, changes = _patch_pod(template, parts, containers, sidecar, where)
        found |= set(names)
        report.append(
            f"{where}: added the {sidecar['name']} sidecar ({sidecar['image']}) and the spool; "
            f"MODELKV_SPOOL_DIR in {', '.join(names)}" + "".join(f"; {change}" for change in changes)
        )
    missing = set(containers) - found
    if missing:
        raise ValueError(f"{name}: no container named {', '.join(sorted(missing))}")
    return workload


def post_render(
    manifests: str,
    selector: dict[str, str],
    containers: list[str],
    image: str | None = None,
    report: list[str] | None = None,
) -> str:
    """The manifests with the sidecar added to every selected workload; what changed appended to ``report``."""
    parts = yaml.safe_load(PARTS.read_text())
    documents = [d for d in yaml.safe_load_all(manifests) if d is not None]
    chosen = [i for i, d in enumerate(documents) if selected(d, selector)]
    if not chosen:
        wanted = ",".join(f"{k}={v}" for k, v in selector.items())
        raise ValueError(f"no {KNOWN} is labelled {wanted}")
    for i in chosen:
        documents[i] = add_sidecar(documents[i], parts, containers, image, report)
    return yaml.safe_dump_all(documents, sort_keys=False, explicit_start=True)


def main(argv: list[str] | None = None) -> int:
    """Read the manifests on stdin, write them patched on stdout and what changed on stderr; errors go to stderr
    with status 1, a missing ``--selector`` or ``--image`` with status 2 before anything is read."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "-l",
        "--selector",
        default=os.environ.get("MODELKV_SELECTOR"),
        help="workload labels, key=value[,key=value] (or $MODELKV_SELECTOR)",
    )
    parser.add_argument(
        "--container", action="append", default=[], help="an engine container's name (repeat); default: all"
    )
    parser.add_argument(
        "--image",
        default=os.environ.get("MODELKV_EXPORTER_IMAGE"),
        help="the sidecar image you pushed, e.g. registry.example.com/modelkv-exporter:0.1.0 "
        "(or $MODELKV_EXPORTER_IMAGE); required",
    )
    args = parser.parse_args(argv)
    if not args.selector:
        parser.error("give --selector or set MODELKV_SELECTOR")
    if not args.image:
        parser.error(MISSING_IMAGE)
    report: list[str] = []
    try:
        patched = post_render(sys.stdin.read(), parse_selector(args.selector), args.container, args.image, report)
    except ValueError as error:
        print(f"modelkv-sidecar: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(patched)
    for line in report:
        print(f"modelkv-sidecar: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
