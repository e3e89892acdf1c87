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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that hold a slow test first, each file's tests together and in order: ``make test`` spreads the
    files over two workers (``-n 2 --dist loadfile``), and a long file started last would run alone at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


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
