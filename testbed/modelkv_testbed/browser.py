"""Headless Chromium (Debian's package) for the tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from modelkv_testbed.processes import require_tool


def chromium() -> str:
    """The headless Chromium binary (Debian's chromium-headless-shell, or a full chromium)."""
    for name in ("chromium-headless-shell", "chromium"):
        path = shutil.which(name)
        if path:
            return path
    return require_tool("chromium-headless-shell")


def chromium_run(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Load ``url`` in headless Chromium with ``args`` (e.g. ``--dump-dom``); no network beyond the URL."""
    return subprocess.run(
        [
            chromium(),
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
