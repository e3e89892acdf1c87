"""The TypeScript compiler the Kubernetes and Grafana checks type-check object literals with (``tests/k8s``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

TSC_OPTIONS = (
    "--strict",
    "--noEmit",
    "--pretty",
    "false",
    "--module",
    "nodenext",
    "--moduleResolution",
    "nodenext",
    "--target",
    "es2022",
    "--skipLibCheck",
)


def run_tsc(node_modules: Path, source: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``tsc --strict --noEmit`` on one source file with the installed compiler; never raises on type errors."""
    tsc = node_modules / "typescript" / "bin" / "tsc"
    return subprocess.run(["node", str(tsc), *TSC_OPTIONS, str(source)], capture_output=True, text=True, cwd=cwd)
