"""Which transformers the engine side's transformers tests run against, and that it is whole.

``make test`` runs ``TRANSFORMERS_TESTS`` (the Makefile) again on the lowest transformers pyproject admits and on the
newest release, each installed with ``--no-deps`` into a folder first on ``PYTHONPATH`` beside ``.venv``'s torch,
and names the pins file in ``MODELKV_TEST_TRANSFORMERS_PINS``. There this test fails when what runs is not what is
pinned (a missed install, a folder not first on the path); anywhere it fails when transformers lacks a dependency
or has one outside the range it declares.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import tomllib
import transformers
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from modelkv_testbed import ROOT
from tests.project.test_dependencies import pins


def admitted() -> Requirement:
    """pyproject's transformers requirement (the ``torch`` extra; the ``vllm`` extra admits the same)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    found = {str(r) for extra in ("torch", "vllm") for r in map(Requirement, extras[extra]) if r.name == "transformers"}
    assert len(found) == 1, found
    return Requirement(found.pop())


def test_the_transformers_that_runs_is_the_one_pinned_here() -> None:
    version = transformers.__version__
    print(f"\ntransformers {version} from {Path(transformers.__file__).parent}")
    assert admitted().specifier.contains(version), f"transformers {version} is outside {admitted()}"
    pinned = os.environ.get("MODELKV_TEST_TRANSFORMERS_PINS")
    if pinned:
        folder = Path(os.environ["PYTHONPATH"].split(os.pathsep)[0]).resolve()
        for name, want in pins(ROOT / pinned).items():
            found = importlib.metadata.distribution(name)
            assert found.version == str(want), f"{name} {found.version} runs, {want} is pinned in {pinned}"
            assert Path(str(found.locate_file(""))).resolve() == folder, f"{name} is not taken from {folder}"
        assert Path(transformers.__file__).resolve().is_relative_to(folder)


def test_every_dependency_of_transformers_is_installed_in_a_version_it_admits() -> None:
    """Followed through the whole tree, as the first distribution of each name on the path is what imports."""
    seen: set[str] = set()
    todo = ["transformers"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for line in importlib.metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            version = importlib.metadata.version(requirement.name)
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{name} needs {requirement}, {version} is installed"
            )
            todo.append(requirement.name)
    assert "huggingface-hub" in seen
