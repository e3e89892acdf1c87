"""The tools stand apart from the tests: ``bench/`` and ``scripts/`` import nothing from ``tests/`` and edit no
``sys.path``; what they share with the tests is ``modelkv_testbed`` (``testbed/``), which imports neither the tests
nor the tools, which the exporter never imports, and which the exporter's wheel and image never hold.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from setuptools import find_packages

from modelkv_testbed import ROOT

TOOLS = ("bench", "scripts")
TESTBED = ROOT / "testbed" / "modelkv_testbed"
PATH_EDIT = re.compile(r"\bsys\.path\b")
"""Any use of ``sys.path``, in code or in the code a tool hands to a child process as a string."""


def imported_modules(source: str) -> set[str]:
    """The top-level names of every module ``source`` imports, at any depth (relative imports aside)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def offences(path: Path, forbidden: frozenset[str], *, path_edits: bool) -> list[str]:
    """What ``path`` does that it must not: import one of ``forbidden``, or (``path_edits``) touch ``sys.path``."""
    source = path.read_text()
    found = [f"{path.name} imports {name}" for name in sorted(imported_modules(source) & forbidden)]
    if path_edits and PATH_EDIT.search(source):
        found.append(f"{path.name} edits sys.path")
    return found


def tool_files() -> list[Path]:
    return sorted(path for tool in TOOLS for path in (ROOT / tool).rglob("*.py"))


@pytest.mark.parametrize("path", tool_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_a_tool_imports_nothing_from_the_tests_and_edits_no_sys_path(path: Path) -> None:
    assert offences(path, frozenset({"tests"}), path_edits=True) == []


def test_the_testbed_imports_neither_the_tests_nor_the_tools() -> None:
    found = [
        offence
        for path in sorted(TESTBED.rglob("*.py"))
        for offence in offences(path, frozenset({"tests", *TOOLS}), path_edits=True)
    ]
    assert found == []


def test_the_exporter_never_imports_the_testbed() -> None:
    package = ROOT / "modelkv_exporter"
    found = [
        o for p in sorted(package.rglob("*.py")) for o in offences(p, frozenset({"modelkv_testbed"}), path_edits=False)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from tests.support import FULL_SCALE\n", ["tool.py imports tests"]),
        ("def main():\n    import tests.support.podman\n", ["tool.py imports tests"]),
        ("import sys\nsys.path.insert(0, '.')\n", ["tool.py edits sys.path"]),
        ("CODE = 'import sys; sys.path.append(\"/x\")'\n", ["tool.py edits sys.path"]),
        ("from modelkv_testbed.snapshots import make_snapshot\n", []),
    ],
)
def test_an_offending_tool_is_caught(tmp_path: Path, source: str, expected: list[str]) -> None:
    tool = tmp_path / "tool.py"
    tool.write_text(source)
    assert offences(tool, frozenset({"tests"}), path_edits=True) == expected


def shipped_packages(root: Path) -> list[str]:
    """The packages the exporter's wheel holds: setuptools' own search with pyproject.toml's ``include``."""
    text = (root / "pyproject.toml").read_text()
    include = re.search(r"\[tool\.setuptools\.packages\.find\]\s*include = \[([^\]]*)\]", text)
    assert include, "pyproject.toml names the packages its wheel holds"
    return sorted(find_packages(str(root), include=re.findall(r'"([^"]+)"', include.group(1))))


def test_the_wheel_and_the_image_hold_the_exporter_only() -> None:
    packages = shipped_packages(ROOT)
    assert "modelkv_exporter.sidecar" in packages
    assert [name for name in packages if not name.startswith("modelkv_exporter")] == []
    copied = re.findall(r"^COPY (?!--from)(.+?) \S+$", (ROOT / "Dockerfile").read_text(), flags=re.M)
    assert copied and [line for line in copied if "testbed" in line or "tests" in line] == []


def test_a_wheel_that_would_take_the_testbed_is_caught(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.packages.find]\ninclude = ["modelkv*"]\n')
    for package in ("modelkv_exporter", "modelkv_testbed"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    assert shipped_packages(tmp_path) == ["modelkv_exporter", "modelkv_testbed"]
