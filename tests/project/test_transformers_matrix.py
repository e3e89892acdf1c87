"""The engine side's transformers tests run on the lowest transformers pyproject admits and on the newest release:
the pins agree with pyproject, and the Makefile's list holds every test file that imports transformers and no vLLM."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from packaging.version import Version

from modelkv_testbed import ROOT
from tests.engine.test_transformers_version import admitted
from tests.project.test_dependencies import pins

VLLM = {"vllm", "vllm_omni"}


def makefile_list(name: str) -> set[str]:
    """A Makefile variable's words, continuation lines joined and ``$(addprefix P,words)`` expanded."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    value = re.search(rf"^{name} := (.*)$", text, re.MULTILINE)
    assert value is not None, f"{name} is not set in the Makefile"
    words = value.group(1)
    for prefix, names in re.findall(r"\$\(addprefix ([^,]+),([^)]*)\)", words):
        words = words.replace(f"$(addprefix {prefix},{names})", " ".join(prefix + n for n in names.split()))
    return set(words.split())


def imported(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def needs_vllm(path: Path) -> bool:
    """Whether a test file imports vLLM or vLLM-Omni, itself or through a test module it imports."""
    for module in imported(path):
        if module.split(".")[0] in VLLM:
            return True
        if module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_"):
            other = ROOT / (module.replace(".", "/") + ".py")
            if other.exists() and other != path and needs_vllm(other):
                return True
    return False


def test_the_ends_are_the_floor_pyproject_admits_and_a_newer_admitted_release() -> None:
    floor = [Version(s.version) for s in admitted().specifier if s.operator == ">="]
    lowest = pins(ROOT / "requirements" / "test-transformers-lowest.txt")["transformers"]
    newest = pins(ROOT / "requirements" / "test-transformers-newest.txt")["transformers"]
    assert [lowest] == floor, f"the lowest end is {lowest}, pyproject admits from {floor}"
    assert newest > lowest and admitted().specifier.contains(newest)


def test_every_test_file_that_imports_transformers_and_no_vllm_runs_on_both_ends() -> None:
    listed = makefile_list("TRANSFORMERS_TESTS")
    assert "tests/engine/test_transformers_version.py" in listed
    for path in sorted(
        [*(ROOT / "tests" / "engine").glob("test_*.py"), *(ROOT / "tests" / "testing").glob("test_*.py")]
    ):
        name = str(path.relative_to(ROOT))
        uses = any(m.split(".")[0] == "transformers" for m in imported(path))
        if uses and not needs_vllm(path):
            assert name in listed, f"{name} imports transformers and no vLLM: add it to TRANSFORMERS_TESTS"
        if name in listed:
            assert not needs_vllm(path), f"{name} imports vLLM, which pins its own transformers"
