"""What the tests share: snapshots built without torch, processes, polling, Prometheus, a browser, exposition parsing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""

VENV_BIN = Path(sys.executable).parent
"""The test environment's scripts (``modelkv-exporter``, ``ruff``)."""

FULL_SCALE = os.environ.get("MODELKV_TEST_SCALE") == "full"
"""bench/reliability.sh sets MODELKV_TEST_SCALE=full: the reliability tests then run at the issue's full size."""
