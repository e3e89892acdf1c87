"""The version is written once, in ``pyproject.toml``: the code reads it from the installed package's metadata,
and every other copy in the tree (image tags, wheel names, examples) is held to it here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import modelkv_exporter
from modelkv_exporter.contract import version
from modelkv_testbed import ROOT

WRITTEN = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
assert WRITTEN, "pyproject.toml has no static version"
PYPROJECT_VERSION = WRITTEN.group(1)

V = r"(\d[\w.+!-]*\w)"
"""A version: it starts and ends with a digit or letter."""
COPIES = (
    re.compile(rf"modelkv-exporter[:/]{V}"),  # an image tag, a snapshot's writer
    re.compile(rf"my-vllm-modelkv:{V}"),  # the engine image the Dockerfile's usage note builds
    re.compile(rf"modelkv_exporter-{V}-py3-none-any\.whl"),  # a wheel's file name
    re.compile(rf"newName: \S+/modelkv-exporter\n\s+newTag: {V}"),  # the example overlay's image tag
    re.compile(rf"ARG VERSION={V}"),  # the image's version label
    re.compile(rf"(?m)^appVersion: \"{V}\""),  # the Helm chart's application
    re.compile(rf"(?m)^version: {V}"),  # the Helm chart's and the post-renderer plugin's own versions
    re.compile(rf"repository: modelkv-exporter\n\s+tag: {V}"),  # the chart's default image tag
    re.compile(rf"`image\.tag` \| string \| `\"{V}\"`"),  # the chart's values table in docs/deploy.md
)
"""Where another file names this package's version; the one group is the version named."""

NOT_COPIES = ("pyproject.toml", "tests/")
"""Tests are no copies: an image tag a test asserts is what a manifest above renders (and that test fails
when they part), one it passes in is any tag; the golden expositions carry what the sidecar renders for the
installed version (``test_golden`` compares them), and their spools are fixtures written by some version."""


def _tracked_text_files() -> dict[str, str]:
    try:
        names = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    texts = {}
    for name in names:
        if name.startswith(NOT_COPIES):
            continue
        try:
            texts[name] = (ROOT / name).read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
    return texts


def test_the_code_reads_the_version_from_the_installed_metadata() -> None:
    assert version.VERSION == metadata.version("modelkv-exporter") == PYPROJECT_VERSION, (
        "the installed package is not this checkout's: pip install -e ."
    )
    assert modelkv_exporter.__version__ == version.VERSION
    result = subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", "--version"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"modelkv-exporter {PYPROJECT_VERSION}"


def test_a_checkout_that_was_never_installed_says_its_version_is_unknown(tmp_path: Path) -> None:
    """A copy of the package alone, run without site-packages, finds no metadata: the version is ``UNKNOWN``.

    A copy, because an editable install leaves ``modelkv_exporter.egg-info`` in the checkout's
    root, where the metadata finder looks when the root is on the path.
    """
    shutil.copytree(
        ROOT / "modelkv_exporter", tmp_path / "modelkv_exporter", ignore=shutil.ignore_patterns("__pycache__")
    )
    result = subprocess.run(
        [sys.executable, "-S", "-m", "modelkv_exporter", "--version"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"modelkv-exporter {version.UNKNOWN}"


def test_every_other_copy_of_the_version_is_the_one_in_pyproject() -> None:
    literal = re.compile(rf"(?<![\w.]){re.escape(PYPROJECT_VERSION)}(?![\w.])")
    stale, unchecked = [], []
    for name, text in _tracked_text_files().items():
        checked: list[range] = []
        for pattern in COPIES:
            for match in pattern.finditer(text):
                checked.append(range(*match.span(1)))
                if match.group(1) != PYPROJECT_VERSION:
                    stale.append(f"{name}: {match.group(0)!r}")
        for match in literal.finditer(text):
            if not any(match.start() in span for span in checked):
                line = text.count("\n", 0, match.start()) + 1
                unchecked.append(f"{name}:{line}")
    assert stale == [], f"copies of another version than pyproject.toml's {PYPROJECT_VERSION}"
    assert unchecked == [], "a copy of the version no pattern in COPIES checks: derive it, or add its pattern"
