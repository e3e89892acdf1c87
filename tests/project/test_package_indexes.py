"""A package's docstring is its index (the exporter's and the testbed's): it names every module and subpackage, or none."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from modelkv_testbed import ROOT

PACKAGES = sorted(
    path.parent
    for root in (ROOT / "modelkv_exporter", ROOT / "testbed" / "modelkv_testbed")
    for path in root.rglob("__init__.py")
)


def members(package: Path) -> set[str]:
    """The modules and subpackages of ``package``, by name (``__init__`` and ``__main__`` aside)."""
    modules = {path.stem for path in package.glob("*.py")} - {"__init__", "__main__"}
    return modules | {path.parent.name for path in package.glob("*/__init__.py")}


def named(package: Path) -> set[str]:
    """The members that the package's docstring names as ````name```` (or ````name.something````)."""
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    return {name for name in members(package) if re.search(rf"``(?:\w+\.)*{name}(?:\.\w+)*``", docstring)}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_a_package_index_names_every_module_or_none(package: Path) -> None:
    found = named(package)
    assert found in (set(), members(package)), f"{package.name}'s docstring misses {sorted(members(package) - found)}"


def test_a_stale_index_is_caught(tmp_path: Path) -> None:
    package = tmp_path / "package"
    package.mkdir()
    (package / "__init__.py").write_text('"""- ``one``: the first."""\n')
    (package / "one.py").write_text("")
    assert named(package) == members(package)
    (package / "two.py").write_text("")
    assert named(package) == {"one"} != members(package)
