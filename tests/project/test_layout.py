"""The package's folders are its design: what each part may import, read from the folders themselves.

- ``contract``: the standard library and itself;
- ``engine``: the contract and itself (torch, vLLM); never the sidecar or its libraries;
- ``sidecar``: the contract, judging and itself (prometheus_client, FastAPI, uvicorn); never the engine, torch or vLLM;
- ``demo``: the contract, the engine and itself (torch); never the sidecar or its libraries;
- ``testing``: the contract, judging, the engine and itself (torch, pytest); never the sidecar or its libraries;
- ``judging``: the standard library, the contract and itself (a declaration's verdict and suggested code, shared by
  ``testing``, ``cli`` and ``sidecar``);
- ``cli``: anything but the engine, and none of torch or vLLM (it loads ``demo`` when asked);
- no part imports the package root; the root imports no part at import time (``publish`` and
  ``__version__`` are imported on first use).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from modelkv_testbed import ROOT

PACKAGE = "modelkv_exporter"
ENGINE_LIBRARIES = frozenset({"torch", "transformers", "vllm", "vllm_omni", "pynvml"})
SIDECAR_LIBRARIES = frozenset(
    {"prometheus_client", "fastapi", "starlette", "uvicorn", "pydantic", "httptools", "uvloop"}
)


@dataclass(frozen=True)
class Rule:
    """What one part may import: which parts of ours, and which third-party libraries it must not."""

    parts: frozenset[str]
    forbidden: frozenset[str] = frozenset()
    stdlib_only: bool = False


PARTS = ("contract", "judging", "engine", "sidecar", "cli", "demo", "testing")
RULES = {
    "contract": Rule(frozenset({"contract"}), stdlib_only=True),
    "judging": Rule(frozenset({"contract", "judging"}), stdlib_only=True),
    "engine": Rule(frozenset({"contract", "engine"}), SIDECAR_LIBRARIES),
    "sidecar": Rule(frozenset({"contract", "judging", "sidecar"}), ENGINE_LIBRARIES),
    "cli": Rule(frozenset({"contract", "judging", "cli", "sidecar", "demo"}), ENGINE_LIBRARIES),
    "demo": Rule(frozenset({"contract", "engine", "demo"}), SIDECAR_LIBRARIES),
    "testing": Rule(frozenset({"contract", "judging", "engine", "testing"}), SIDECAR_LIBRARIES),
}


@dataclass(frozen=True)
class Import:
    """One import statement's target module, where it is, and whether it runs when the module is imported."""

    module: str
    line: int
    at_import_time: bool


def _deferred(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside a function, or under ``if TYPE_CHECKING:``."""
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return True
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(path: Path, package_root: Path) -> list[Import]:
    """Every import in ``path``, relative ones resolved, ``from X import name`` as ``X.name``."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    here = [PACKAGE, *path.relative_to(package_root).with_suffix("").parts]
    found = []
    for node in ast.walk(tree):
        at_import_time = not _deferred(node, parents)
        if isinstance(node, ast.Import):
            found += [Import(alias.name, node.lineno, at_import_time) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here[: len(here) - node.level]
                base = ".".join([*anchor, base] if base else anchor)
            found += [Import(f"{base}.{alias.name}", node.lineno, at_import_time) for alias in node.names]
    return found


def violations(package_root: Path) -> list[str]:
    """Every import that breaks the rules, as ``file:line: reason``."""
    problems = []
    for path in sorted(package_root.rglob("*.py")):
        relative = path.relative_to(package_root)
        part = relative.parts[0] if len(relative.parts) > 1 else None
        for imported in imports_of(path, package_root):
            where = f"{relative}:{imported.line}"
            names = imported.module.split(".")
            if names[0] == PACKAGE:
                target = names[1] if len(names) > 1 else ""
                if part is None:
                    if path.name == "__init__.py" and imported.at_import_time:
                        problems.append(f"{where}: the package root imports {imported.module} at import time")
                elif target not in RULES[part].parts:
                    problems.append(f"{where}: {part} imports {imported.module}")
            elif part is not None:
                rule = RULES[part]
                if rule.stdlib_only and names[0] not in sys.stdlib_module_names and names[0] != "__future__":
                    problems.append(f"{where}: {part} imports {names[0]}, which is not in the standard library")
                elif names[0] in rule.forbidden:
                    problems.append(f"{where}: {part} imports {names[0]}")
    return problems


def test_every_part_is_a_folder_with_a_rule() -> None:
    folders = {p.name for p in (ROOT / PACKAGE).iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(RULES)
    top = {p.name for p in (ROOT / PACKAGE).glob("*.py")}
    assert top == {"__init__.py", "__main__.py", "protocol.py"}, "everything else lives in a part"


def test_the_package_follows_its_import_rules() -> None:
    assert violations(ROOT / PACKAGE) == []


def import_circles(package_root: Path) -> list[list[str]]:
    """Every set of modules that import one another in a loop, deferred imports included: each a sorted list."""
    paths = sorted(package_root.rglob("*.py"))
    names = {
        path: ".".join([PACKAGE, *path.relative_to(package_root).with_suffix("").parts]).removesuffix(".__init__")
        for path in paths
    }
    known = set(names.values())
    graph: dict[str, set[str]] = {name: set() for name in known}
    for path, name in names.items():
        for imported in imports_of(path, package_root):
            target = imported.module
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    reaches: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for following in graph[todo.pop()] - seen:
                seen.add(following)
                todo.append(following)
        reaches[start] = seen
    circles = {tuple(sorted(m for m in graph if m in reaches[name] and name in reaches[m])) for name in graph}
    return sorted(list(circle) for circle in circles if circle)


def test_no_module_imports_itself_through_others() -> None:
    assert import_circles(ROOT / PACKAGE) == []


def test_a_circle_of_imports_is_caught(tmp_path: Path) -> None:
    copy = tmp_path / PACKAGE
    shutil.copytree(ROOT / PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    log = copy / "engine" / "engine_log.py"
    log.write_text(log.read_text() + "\n\ndef later() -> None:\n    from modelkv_exporter.engine import resolve\n")
    circle = [f"{PACKAGE}.engine.{name}" for name in ("engine_log", "protocol", "resolve")]
    assert import_circles(copy) == [circle], "resolve imports engine_log directly and through protocol"


@pytest.mark.parametrize(
    "file,line,expected",
    [
        ("sidecar/labels.py", "import torch", "sidecar imports torch"),
        (
            "sidecar/labels.py",
            "from modelkv_exporter.engine import engine_log",
            "sidecar imports modelkv_exporter.engine.engine_log",
        ),
        (
            "engine/engine_log.py",
            "from modelkv_exporter.sidecar import catalogue",
            "engine imports modelkv_exporter.sidecar",
        ),
        ("engine/engine_log.py", "import prometheus_client", "engine imports prometheus_client"),
        ("contract/spool.py", "import yaml", "contract imports yaml, which is not in the standard library"),
        ("contract/spool.py", "from ..engine import engine_log", "contract imports modelkv_exporter.engine"),
        ("contract/spool.py", "from ..sidecar.reader import scan", "contract imports modelkv_exporter.sidecar"),
        ("contract/spool.py", "from ..judging import verdicts", "contract imports modelkv_exporter.judging"),
        (
            "judging/verdicts.py",
            "from modelkv_exporter.engine import engine_log",
            "judging imports modelkv_exporter.engine",
        ),
        (
            "engine/engine_log.py",
            "from modelkv_exporter.judging import verdicts",
            "engine imports modelkv_exporter.judging",
        ),
        ("cli/reports.py", "import vllm", "cli imports vllm"),
        ("demo/owners.py", "from modelkv_exporter.cli import reports", "demo imports modelkv_exporter.cli"),
        ("demo/owners.py", "from modelkv_exporter.sidecar import catalogue", "demo imports modelkv_exporter.sidecar"),
        ("testing/run.py", "from modelkv_exporter.cli import check_report", "testing imports modelkv_exporter.cli"),
        ("testing/run.py", "import fastapi", "testing imports fastapi"),
        ("cli/check_report.py", "from modelkv_exporter.testing import report", "cli imports modelkv_exporter.testing"),
        ("demo/owners.py", "from modelkv_exporter.protocol import ModelLocalKVSpec", "demo imports modelkv_exporter"),
        (
            "engine/engine_log.py",
            "from modelkv_exporter import __version__",
            "engine imports modelkv_exporter.__version__",
        ),
        ("__init__.py", "from modelkv_exporter.sidecar import catalogue", "the package root imports"),
    ],
)
def test_a_forbidden_import_is_caught(tmp_path: Path, file: str, line: str, expected: str) -> None:
    """The package as it is has none (``test_the_package_follows_its_import_rules``); the copy with the line has
    the one."""
    copy = tmp_path / PACKAGE
    shutil.copytree(ROOT / PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / file
    target.write_text(target.read_text() + f"\n{line}\n")
    found = violations(copy)
    assert len(found) == 1 and expected in found[0] and found[0].startswith(file), found


def _modules(*parts: str) -> list[str]:
    names = []
    for part in parts:
        for path in sorted((ROOT / PACKAGE / part).rglob("*.py")):
            module = ".".join([PACKAGE, *path.relative_to(ROOT / PACKAGE).with_suffix("").parts])
            names.append(module.removesuffix(".__init__"))
    return names


def _ours_loaded_after(code: str) -> set[str]:
    """The modules of this package that running ``code`` in a fresh interpreter loads."""
    probe = code + f"\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == {PACKAGE!r}))\n"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    loaded: set[str] = set(ast.literal_eval(result.stdout.strip().splitlines()[-1]))
    return loaded


def _loaded_after(code: str) -> set[str]:
    probe = code + "\nimport sys\nprint(sorted({m.split('.')[0] for m in sys.modules}))\n"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    loaded: set[str] = set(ast.literal_eval(result.stdout.strip().splitlines()[-1]))
    return loaded


def test_the_sidecar_and_the_cli_load_neither_torch_nor_vllm() -> None:
    modules = _modules("contract", "judging", "sidecar", "cli")
    code = (
        f"for name in {modules!r}: __import__(name)\nfrom modelkv_exporter.cli.main import build_parser; build_parser()"
    )
    assert _loaded_after(code) & ENGINE_LIBRARIES == set()


def test_the_engine_hook_loads_none_of_the_sidecars_libraries() -> None:
    code = (
        "import os; os.environ['MODELKV_SPOOL_DIR'] = '/nonexistent'\n"
        f"for name in {_modules('contract', 'engine')!r}: __import__(name)\n"
        "from modelkv_exporter.engine.vllm_hook.plugin import register; register()"
    )
    assert _loaded_after(code) & SIDECAR_LIBRARIES == set()


def test_the_engine_hook_loads_only_the_contract_and_the_engine() -> None:
    """What a vLLM worker loads of this package, hook and publishing included: no reader, decoder or sidecar module."""
    code = (
        "import os; os.environ['MODELKV_SPOOL_DIR'] = '/nonexistent'\n"
        f"for name in {_modules('engine')!r}: __import__(name)\n"
        "from modelkv_exporter.engine.vllm_hook.plugin import register; register()"
    )
    loaded = _ours_loaded_after(code)
    assert f"{PACKAGE}.engine.vllm_hook.lifecycle" in loaded and f"{PACKAGE}.contract.spool" in loaded
    assert {name.split(".")[1] for name in loaded - {PACKAGE}} == {"contract", "engine"}, sorted(loaded)
    reader = set(_modules("sidecar/reader"))
    assert f"{PACKAGE}.sidecar.reader.decode" in reader and loaded.isdisjoint(reader)


def test_publish_is_the_function_whatever_was_imported_first() -> None:
    code = "import modelkv_exporter.engine.publish\nfrom modelkv_exporter import publish\nprint(callable(publish), publish.__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "True publish"


def test_model_authors_import_path_is_the_engines_protocol() -> None:
    from modelkv_exporter import protocol
    from modelkv_exporter.engine import protocol as implementation

    assert all(getattr(protocol, name) is getattr(implementation, name) for name in implementation.__all__)


def test_the_model_authors_check_loads_none_of_the_sidecars_libraries() -> None:
    code = f"for name in {_modules('testing')!r}: __import__(name)\nimport modelkv_exporter.testing as t; t.check"
    loaded = _ours_loaded_after(code)
    assert {name.split(".")[1] for name in loaded - {PACKAGE}} == {"contract", "judging", "engine", "testing"}, sorted(
        loaded
    )
    assert _loaded_after(code) & SIDECAR_LIBRARIES == set()
