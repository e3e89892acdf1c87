"""vLLM's released source, read from its wheel without installing it (``pip download --no-deps``, cached under build/).

vLLM 0.34 needs a CUDA torch and has no CPU build: its worker modules cannot be imported here, but
their source can be read, parsed and checked against what the hook expects.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from modelkv_testbed import ROOT

CACHE = ROOT / "build" / "vllm-wheels"


def wheel(version: str, cache: Path = CACHE) -> Path:
    """The vLLM ``version`` wheel for this platform, downloaded once into ``cache`` (PyPI, no dependencies)."""
    found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "--only-binary=:all:",
             "--quiet", "-d", str(cache)],
            check=True,
        )  # fmt: skip
        found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    assert found, f"pip download left no vllm {version} wheel in {cache}"
    return found[0]


def source(path: Path, module_path: str) -> str:
    """The text of ``module_path`` (e.g. ``vllm/v1/worker/gpu_worker.py``) in the wheel at ``path``."""
    with zipfile.ZipFile(path) as archive:
        return archive.read(module_path).decode()


@dataclass(frozen=True)
class Signature:
    """A function's parameters as written (``ast.unparse`` of its arguments), and whether it is a property."""

    parameters: str
    is_property: bool = False


def methods(text: str, class_name: str) -> dict[str, Signature]:
    """Every method a class defines in ``text``, by name: its parameters as written."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            found = {}
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    decorators = {ast.unparse(d) for d in item.decorator_list}
                    found[item.name] = Signature(ast.unparse(item.args), "property" in decorators)
            return found
    raise LookupError(f"no class {class_name}")


def attributes_set(text: str, class_name: str) -> set[str]:
    """Names a class assigns on ``self`` anywhere in its methods."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {
                target.attr
                for item in ast.walk(node)
                if isinstance(item, (ast.Assign, ast.AnnAssign))
                for target in (item.targets if isinstance(item, ast.Assign) else [item.target])
                if isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            }
    raise LookupError(f"no class {class_name}")


def calls_in_order(text: str, class_name: str, method: str, names: tuple[str, ...]) -> list[str]:
    """The calls among ``names`` (as ``x.name(...)``) in ``class_name.method``, in source order."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    calls = [
                        (call.lineno, call.col_offset, call.func.attr)
                        for call in ast.walk(item)
                        if isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Attribute)
                        and call.func.attr in names
                    ]
                    return [name for _, _, name in sorted(calls)]
    raise LookupError(f"no method {class_name}.{method}")
