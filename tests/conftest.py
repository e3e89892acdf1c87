"""Fixtures: an empty spool directory, and a real sidecar process serving it. Helpers live in ``modelkv_testbed`` (shared with bench/ and scripts/) and ``tests.support``."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelkv_testbed.processes import Sidecar, start_sidecar, stop_process


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the transformers the engine tests ran against (``make test`` runs some of them on several)."""
    try:
        found = importlib.metadata.distribution("transformers")
    except importlib.metadata.PackageNotFoundError:
        terminalreporter.write_line("transformers: not installed")
        return
    terminalreporter.write_line(f"transformers {found.version} ({found.locate_file('')})")


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    """An empty spool directory."""
    path = tmp_path / "spool"
    path.mkdir()
    return path


@pytest.fixture
def sidecar(spool: Path) -> Iterator[Sidecar]:
    """A real sidecar process serving ``spool`` on 127.0.0.1."""
    running = start_sidecar(spool)
    yield running
    stop_process(running.process)
