"""Lint, format and type checks run with the tests, so CI enforces them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from modelkv_testbed import ROOT, VENV_BIN

CHECKS = {
    "ruff check": [
        str(VENV_BIN / "ruff"),
        "check",
        "modelkv_exporter",
        "tests",
        "testbed",
        "bench",
        "dashboards",
        "scripts",
        "deploy",
    ],
    "ruff format": [
        str(VENV_BIN / "ruff"),
        "format",
        "--check",
        ".",
    ],
    "mypy": [
        sys.executable,
        "-m",
        "mypy",
    ],
}


@pytest.mark.parametrize("name", CHECKS)
def test_check_passes(name: str) -> None:
    result = subprocess.run(CHECKS[name], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
