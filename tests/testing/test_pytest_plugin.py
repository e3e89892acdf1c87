"""The pytest fixture as a model author uses it: a test module whose check is one line, run by pytest itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tomllib

from modelkv_testbed import ROOT

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
            "*AssertionError: model-local KV check at max_num_seqs=2 failed:*",
            "*'(root)' (Generator): under-reports by 1.14x*wrong field physical_capacity_positions*",
            "*FAIL '(root)' (Generator): under-reports by 1.14x*",
            "*wrong field physical_capacity_positions: declares 7 positions a row*held 8 a row*",
            "*physical_capacity_positions=8,*",
        ]
    )
    out = result.stdout.str()
    assert "self = " not in out and "Report(" not in out, "the report comes first: no dump of the check's frames"
    assert "testing/report.py" not in out and "testing/pytest_plugin.py" not in out, "library frames hidden"


def installed_entry_points(directory: Path) -> None:
    """What installing this checkout registers for pytest: pyproject's ``pytest11`` entry points as dist metadata."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    points = project["project"]["entry-points"]["pytest11"]
    info = directory / "modelkv_exporter_pytest11_under_test-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: modelkv-exporter-pytest11-under-test\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))


AUTOLOADED = """
import sys


def test_loaded_without_a_line_and_light(request):
    assert "torch" not in sys.modules and "modelkv_exporter.testing.run" not in sys.modules
    assert request.config.pluginmanager.has_plugin("modelkv_exporter.testing.pytest_plugin")


def test_right(model_local_kv):
    from tests.testing.owners import Generator, drive

    model_local_kv(Generator(), drive, max_num_seqs=2, batches=(1, 2))
"""


def test_the_entry_point_registers_the_fixture_without_a_pytest_plugins_line(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    installed_entry_points(site)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ["PYTHONPATH"]]))
    pytester.makepyfile(test_auto=AUTOLOADED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "test_auto.py")
    result.assert_outcomes(passed=2)
    pytester.makepyfile(test_both=MODULE)
    both = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "test_both.py")
    both.assert_outcomes(passed=1, failed=1)
    assert "already registered" not in both.stdout.str() + both.stderr.str()


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
