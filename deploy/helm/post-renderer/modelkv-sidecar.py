#!/usr/bin/env python3
"""Helm post-renderer: add modelkv-exporter's native sidecar to the engine pods another chart renders.

Helm passes every rendered manifest on stdin; this writes them back on stdout, with each Deployment and
StatefulSet whose labels match ``--selector`` given, from ``sidecar.yaml`` beside this file (generated
from deploy/kubernetes/base/deployment.yaml, so the kustomize base and this add the same sidecar):

- the sidecar as an init container with ``restartPolicy: Always`` (a native sidecar, Kubernetes >= 1.29),
  with its metrics and probe ports and its restricted security context;
- the spool, an in-memory ``emptyDir``;
- in each engine container (``--container``, else every container), ``MODELKV_SPOOL_DIR`` and the spool's mount;
- the pod label the chart's PodMonitor selects.

Everything else passes through unchanged. A workload that already has the sidecar is left as it is, so
running it twice changes nothing. It fails when the selector matches no workload. Needs Python 3.9+ and PyYAML.

    helm install vllm vllm/vllm-stack -f my-values.yaml \\
        --post-renderer ./deploy/helm/post-renderer/modelkv-sidecar.py \\
        --post-renderer-args=--selector=helm-release-name=vllm
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
WORKLOADS = {("apps/v1", "Deployment"), ("apps/v1", "StatefulSet")}


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


def selected(document: Any, selector: dict[str, str]) -> bool:
    """Whether ``document`` is a Deployment or StatefulSet whose labels include ``selector``."""
    if not isinstance(document, dict) or (document.get("apiVersion"), document.get("kind")) not in WORKLOADS:
        return False
    labels = (document.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def add_sidecar(
    workload: dict[str, Any], parts: dict[str, Any], containers: list[str], image: str | None = None
) -> dict[str, Any]:
    """A copy of ``workload`` with the sidecar, the spool and the engines' spool settings added."""
    workload = copy.deepcopy(workload)
    template = workload["spec"]["template"]
    spec = template["spec"]
    sidecar = copy.deepcopy(parts["initContainer"])
    if image:
        sidecar["image"] = image
    name = workload["metadata"].get("name", "?")
    if any(c.get("name") == sidecar["name"] for c in spec.get("initContainers") or []):
        return workload
    template.setdefault("metadata", {})
    template["metadata"]["labels"] = {**(template["metadata"].get("labels") or {}), **parts["podLabels"]}
    spec["initContainers"] = [*(spec.get("initContainers") or []), sidecar]
    volume = parts["volume"]
    if any(v.get("name") == volume["name"] for v in spec.get("volumes") or []):
        raise ValueError(f"{name}: a volume is already named {volume['name']}")
    spec["volumes"] = [*(spec.get("volumes") or []), copy.deepcopy(volume)]
    engines = [c for c in spec["containers"] if not containers or c["name"] in containers]
    missing = set(containers) - {c["name"] for c in engines}
    if missing:
        raise ValueError(f"{name}: no container named {', '.join(sorted(missing))}")
    for engine in engines:
        env = engine.get("env") or []
        for variable in parts["engineEnv"]:
            present = [e for e in env if e.get("name") == variable["name"]]
            if present and present[0] != variable:
                raise ValueError(f"{name}/{engine['name']}: {variable['name']} is set to something else")
            if not present:
                env = [*env, copy.deepcopy(variable)]
        engine["env"] = env
        mount = parts["engineVolumeMount"]
        mounts = engine.get("volumeMounts") or []
        if any(m.get("mountPath") == mount["mountPath"] for m in mounts):
            raise ValueError(f"{name}/{engine['name']}: something is already mounted at {mount['mountPath']}")
        engine["volumeMounts"] = [*mounts, copy.deepcopy(mount)]
    return workload


def post_render(manifests: str, selector: dict[str, str], containers: list[str], image: str | None = None) -> str:
    """The manifests with the sidecar added to every selected workload."""
    parts = yaml.safe_load(PARTS.read_text())
    documents = [d for d in yaml.safe_load_all(manifests) if d is not None]
    chosen = [i for i, d in enumerate(documents) if selected(d, selector)]
    if not chosen:
        wanted = ",".join(f"{k}={v}" for k, v in selector.items())
        raise ValueError(f"no Deployment or StatefulSet is labelled {wanted}")
    for i in chosen:
        documents[i] = add_sidecar(documents[i], parts, containers, image)
    return yaml.safe_dump_all(documents, sort_keys=False, explicit_start=True)


def main(argv: list[str] | None = None) -> int:
    """Read the manifests on stdin, write them patched on stdout; errors go to stderr with status 1."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
        help="the sidecar image (or $MODELKV_EXPORTER_IMAGE); default: sidecar.yaml's",
    )
    args = parser.parse_args(argv)
    if not args.selector:
        parser.error("give --selector or set MODELKV_SELECTOR")
    try:
        sys.stdout.write(post_render(sys.stdin.read(), parse_selector(args.selector), args.container, args.image))
    except ValueError as error:
        print(f"modelkv-sidecar: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
