"""How the reports write a command the reader can paste: this CLI as the reader runs it."""

from __future__ import annotations

import sys
from pathlib import Path


def cli_command() -> str:
    """How to run this CLI from where the user stands: the console script beside this Python, else ``-m``."""
    script = Path(sys.executable).parent / "modelkv-exporter"
    if not script.exists():
        return f"{sys.executable} -m modelkv_exporter"
    try:
        return str(script.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(script)
