"""The deployment tools need PyYAML (``pip install '.[deploy]'``): without it they say so in one line, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from modelkv_testbed import ROOT

TOOLS = [
    ROOT / "deploy" / "kubernetes" / "generate_manifests.py",
    ROOT / "deploy" / "helm" / "post-renderer" / "modelkv-sidecar.py",
]
WITHOUT_YAML = "import runpy, sys; sys.modules['yaml'] = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
"""Run a script as ``__main__`` in an interpreter where ``import yaml`` fails as it does when PyYAML is missing."""


@pytest.mark.parametrize("tool", TOOLS, ids=lambda p: p.name)
def test_a_tool_without_pyyaml_says_what_to_install(tool: Path) -> None:
    result = subprocess.run([sys.executable, "-c", WITHOUT_YAML, str(tool), "--help"], capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and f"{tool.name} needs PyYAML" in result.stderr
    assert "pip install pyyaml" in result.stderr and "pip install '.[deploy]'" in result.stderr


@pytest.mark.parametrize("tool", TOOLS, ids=lambda p: p.name)
def test_a_tool_with_pyyaml_runs(tool: Path) -> None:
    """The same interpreter, PyYAML left alone: the tool gets as far as its help."""
    allowed = WITHOUT_YAML.replace("sys.modules['yaml'] = None; ", "")
    result = subprocess.run([sys.executable, "-c", allowed, str(tool), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "usage:" in result.stdout, result.stderr


def test_the_deploy_extra_installs_pyyaml() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [Requirement(r).name.lower() for r in extras["deploy"]] == ["pyyaml"]
