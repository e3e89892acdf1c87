"""No two modules of the package share a file name: a traceback's file name or an import's last word names one module.

``__init__.py`` and ``__main__.py`` repeat by design; ``protocol.py`` twice on purpose: ``modelkv_exporter.protocol``
is the import path model authors write, ``engine/protocol.py`` its implementation (docs/architecture.md says so).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from modelkv_testbed import ROOT

PACKAGE = ROOT / "modelkv_exporter"
REPEATABLE = frozenset({"__init__.py", "__main__.py"})
ALLOWED = {"protocol.py": frozenset({"protocol.py", "engine/protocol.py"})}
"""A file name that may repeat, and the only paths (relative to the package) that may carry it."""


def shared_names(package: Path) -> dict[str, list[str]]:
    """Every file name two or more modules of ``package`` carry, with their paths, but the allowed ones."""
    paths: dict[str, list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        if path.name not in REPEATABLE:
            paths[path.name].append(path.relative_to(package).as_posix())
    return {
        name: where
        for name, where in paths.items()
        if len(where) > 1 and not (name in ALLOWED and set(where) <= ALLOWED[name])
    }


def test_no_two_modules_share_a_file_name() -> None:
    assert shared_names(PACKAGE) == {}


def test_a_shared_name_is_caught(tmp_path: Path) -> None:
    for name in ("engine/protocol.py", "protocol.py", "engine/__init__.py", "cli/__init__.py", "cli/main.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert shared_names(tmp_path) == {}
    (tmp_path / "engine" / "main.py").write_text("")
    (tmp_path / "cli" / "protocol.py").write_text("")
    assert shared_names(tmp_path) == {
        "main.py": ["cli/main.py", "engine/main.py"],
        "protocol.py": ["cli/protocol.py", "engine/protocol.py", "protocol.py"],
    }
