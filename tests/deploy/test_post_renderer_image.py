"""The post-renderer refuses to run without the sidecar image: the placeholder in sidecar.yaml is served by no
registry, and a native sidecar that cannot be pulled keeps the engine container from starting."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from tests.deploy.test_helm import ENGINE_CHARTS, POST_RENDERER, generate_manifests

MANIFESTS = (ENGINE_CHARTS / "vllm-example-chart.yaml").read_text()


def run(*args: str, image_variable: str | None = None) -> subprocess.CompletedProcess[str]:
    """The post-renderer as Helm runs it, with ``MODELKV_EXPORTER_IMAGE`` set to ``image_variable`` or unset."""
    env = {k: v for k, v in os.environ.items() if k != "MODELKV_EXPORTER_IMAGE"}
    if image_variable is not None:
        env["MODELKV_EXPORTER_IMAGE"] = image_variable
    return subprocess.run(
        [sys.executable, str(POST_RENDERER), *args], input=MANIFESTS, capture_output=True, text=True, env=env
    )


def sidecar_image(manifests: str) -> str:
    workload = yaml.safe_load(manifests)
    (sidecar,) = [c for c in workload["spec"]["template"]["spec"]["initContainers"] if c["name"] == "modelkv-exporter"]
    return str(sidecar["image"])


def test_without_an_image_it_refuses_with_status_2_and_says_why() -> None:
    placeholder = generate_manifests.sidecar_parts()["initContainer"]["image"]
    for result in (run("--selector", "release=test"), run("--selector", "release=test", image_variable="")):
        assert result.returncode == 2 and result.stdout == "", result.stderr
        assert "Traceback" not in result.stderr and placeholder not in result.stdout
        message = result.stderr.splitlines()[-1]
        assert "give --image (or set MODELKV_EXPORTER_IMAGE)" in message
        assert "--post-renderer-args=--image=" in message and "keeps the engine from starting" in message


def test_the_image_given_is_the_sidecars() -> None:
    flag = run("--selector", "release=test", "--image", "registry.example.com/modelkv-exporter:0.1.0")
    assert flag.returncode == 0, flag.stderr
    assert sidecar_image(flag.stdout) == "registry.example.com/modelkv-exporter:0.1.0"
    variable = run("--selector", "release=test", image_variable="mirror.example.com/mkv:0.1.0")
    assert variable.returncode == 0, variable.stderr
    assert sidecar_image(variable.stdout) == "mirror.example.com/mkv:0.1.0"
    assert "(mirror.example.com/mkv:0.1.0)" in variable.stderr, "the report names the image it used"
