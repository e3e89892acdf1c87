"""The pytest fixture as a model author uses it: a test module whose check is one line, run by pytest itself."""

from __future__ import annotations

import os

import pytest

from tests.support import ROOT

pytest_plugins = ["pytester"]

MODULE = """
pytest_plugins = ["modelkv_exporter.testing.pytest_plugin"]

from tests.testing.owners import Generator, drive, spec


def test_right(model_local_kv):
    model_local_kv(Generator(), drive, max_num_seqs=2, batches=(1, 2))


def test_capacity_one_short(model_local_kv):
    model_local_kv(Generator([spec(physical_capacity_positions=7)]), drive, max_num_seqs=2, batches=(1, 2))
"""


@pytest.fixture(autouse=True)
def this_checkout_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pytest run in a subprocess imports this checkout's package and test helpers."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def test_the_fixture_passes_a_right_declaration_and_fails_a_wrong_one_naming_the_field(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_model=MODULE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*AssertionError: model-local KV declarations do not hold what their caches do*",
            "*FAIL '(root)' (Generator): under-reports by 1.14x*",
            "*wrong field physical_capacity_positions: declares 7 positions a row*held 8 a row*",
            "*physical_capacity_positions=8,*",
        ]
    )


def test_loading_the_plugin_imports_no_torch(pytester: pytest.Pytester) -> None:
    """Loaded by every test run that lists it, it costs nothing until the fixture is used."""
    pytester.makepyfile(
        test_light="""
import sys
pytest_plugins = ["modelkv_exporter.testing.pytest_plugin"]

def test_nothing_heavy():
    assert "torch" not in sys.modules
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1)
