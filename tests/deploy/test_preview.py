"""deploy.md's preview and validation before installing: the test runs the commands the doc shows, in order, on the
example overlay, the chart and the post-renderer's output, and the offline validation passes them and refuses a
broken object."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import helm_python as helm
import pytest

from modelkv_testbed import ROOT
from modelkv_testbed.processes import require_tool
from tests.deploy.test_helm import ENGINE_CHARTS, POST_RENDERER

DEPLOY_DOC = ROOT / "docs" / "deploy.md"
PREVIEW_HEADING = "### Preview and validate before installing"
VALIDATOR = Path(sys.executable).parent / "kubernetes-validate"
"""The offline validator, installed beside the interpreter by the test requirements."""


def preview_commands() -> list[list[str]]:
    """The commands of deploy.md's preview block, one per line (continuations joined), split as a shell would."""
    section = DEPLOY_DOC.read_text().split(PREVIEW_HEADING, 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def rendered(command: list[str]) -> str:
    """What one rendering line of the block writes: ``kubectl kustomize`` itself; ``helm template`` of the chart by
    Helm's own engine (helm_python, as tests/deploy/test_helm.py renders it); ``helm template`` of an engine chart
    as the post-renderer that line names patches it, on production-stack's shape (tests/deploy/engine_charts)."""
    if command[:2] == ["kubectl", "kustomize"]:
        result = subprocess.run([require_tool("kubectl"), *command[1:]], capture_output=True, text=True, cwd=ROOT)
        assert result.returncode == 0, result.stderr
        return result.stdout
    assert command[:2] == ["helm", "template"], command
    name, chart = command[2:4]
    namespace = command[command.index("--namespace") + 1]
    if (ROOT / chart).is_dir():
        assert not [a for a in command if a.startswith(("--set", "-f", "--values"))], "rendered with the defaults"
        manifests = helm.Chart.load(ROOT / chart).render({}, name=name, namespace=namespace)
        return "".join(f"---\n{text}\n" for path, text in manifests.items() if not path.endswith("/NOTES.txt"))
    renderer = command[command.index("--post-renderer") + 1]
    assert ROOT / renderer == POST_RENDERER, renderer
    arguments = [a.removeprefix("--post-renderer-args=") for a in command if a.startswith("--post-renderer-args=")]
    engines = (ENGINE_CHARTS / "production-stack.yaml").read_text()
    result = subprocess.run(
        [sys.executable, str(POST_RENDERER), *arguments], input=engines, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def validate(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    if not VALIDATOR.exists():
        pytest.skip("kubernetes-validate is not installed here (requirements/test.txt installs it)")
    return subprocess.run([str(VALIDATOR), *command[1:]], capture_output=True, text=True, cwd=cwd)


def test_the_preview_the_doc_shows_renders_and_validates(tmp_path: Path) -> None:
    commands = preview_commands()
    assert [c[:2] for c in commands] == [
        ["kubectl", "kustomize"],
        ["helm", "template"],
        ["helm", "template"],
        ["kubectl", "apply"],
        ["kubernetes-validate", "--strict"],
    ]
    preview = commands[-1][-1]
    assert commands[-2] == ["kubectl", "apply", "--dry-run=server", "-f", preview], "the server judges the same file"
    assert [c[-2:] for c in commands[:3]] == [[">", preview], [">>", preview], [">>", preview]]
    text = "".join(rendered(command[:-2]) for command in commands[:3])
    (tmp_path / preview).write_text(text)

    result = validate(commands[-1], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    passed = set(re.findall(r"passed for resource (\S+)", result.stdout + result.stderr))
    assert {"deployment/vllm-omni", "deployment/vllm-llama3-deployment-vllm", "configmap/modelkv-dashboards"} <= passed
    assert "Couldn't find schema for kind PodMonitor" in result.stdout + result.stderr, "said, not failed"

    broken = re.sub(r"(?m)^( *)restartPolicy: Always$", r"\g<0>\n\1restartPolicyTypo: Always", text, count=1)
    assert broken != text
    (tmp_path / preview).write_text(broken)
    refused = validate(commands[-1], tmp_path)
    assert refused.returncode != 0 and "restartPolicyTypo" in refused.stdout + refused.stderr, refused.stdout
