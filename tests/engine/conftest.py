"""Fixtures of the engine tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from modelkv_exporter.engine.observe import Observer, install, installed


@pytest.fixture
def observer() -> Iterator[Observer]:
    """The process's observer, installed for one test and removed after it."""
    assert installed() is None, "an earlier test left the observer installed"
    found = install([], enabled=True)
    assert found.unavailable is None, found.unavailable
    yield found
    found.uninstall()
