"""The sidecar's libraries (the ``sidecar`` extra): tested at both ends of the range pyproject.toml admits, and the
tests run the image's.

``requirements/sidecar.txt`` pins what the image installs; the Makefile installs every test environment
with it as constraints. ``requirements/test-sidecar-lowest.txt`` pins pyproject's floors for the HTTP
tests' second environment. The HTTP libraries are capped at the image's versions: the newest tested.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from modelkv_testbed import ROOT

CAPPED = ("fastapi", "starlette", "uvicorn")
"""Capped at the newest version tested: the guard subclasses uvicorn's protocol, the routes use Starlette's."""


def dependencies() -> dict[str, Requirement]:
    """The sidecar's libraries (pyproject.toml's ``sidecar`` extra), by canonical name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {canonicalize_name(r.name): r for r in map(Requirement, project["optional-dependencies"]["sidecar"])}


def pins(path: Path) -> dict[str, Version]:
    """The ``name==version`` lines of a requirements file, by canonical name."""
    pinned: dict[str, Version] = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.split("#")[0].partition("==")
        if sep:
            pinned[canonicalize_name(name.strip())] = Version(version.split(";")[0].strip())
    return pinned


IMAGE = pins(ROOT / "requirements" / "sidecar.txt")
LOWEST = pins(ROOT / "requirements" / "test-sidecar-lowest.txt")


def test_the_lowest_environment_pins_each_dependency_at_its_floor() -> None:
    for name, requirement in dependencies().items():
        floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert len(floors) == 1, f"{name}: one lowest version, which make test runs"
        assert LOWEST.get(name) == floors[0], (
            f"{name}: {LOWEST.get(name)} in the lowest environment, {floors[0]} admitted"
        )


def test_the_http_libraries_are_capped_at_the_images_versions() -> None:
    declared = dependencies()
    for name in CAPPED:
        caps = [(s.operator, Version(s.version)) for s in declared[name].specifier if s.operator.startswith("<")]
        assert caps == [("<=", IMAGE[name])], f"{name}: capped at {IMAGE[name]}, the newest tested ({caps})"


def test_the_image_installs_versions_pyproject_admits() -> None:
    for name, requirement in dependencies().items():
        if requirement.marker is None or requirement.marker.evaluate():
            assert name in IMAGE, f"{name} is not pinned for the image"
            assert requirement.specifier.contains(IMAGE[name]), f"{name}=={IMAGE[name]} outside {requirement.specifier}"


def test_the_tests_run_the_images_versions() -> None:
    """This environment (``make test``'s ``.venv``) holds exactly the image's versions of the sidecar's libraries."""
    installed = {name: Version(importlib.metadata.version(name)) for name in IMAGE}
    assert installed == IMAGE


def test_the_model_authors_check_needs_only_the_torch_extra() -> None:
    """``modelkv_exporter.testing`` imports torch and transformers (the ``torch`` extra), pytest only in its
    plugin (loaded by pytest), and adds nothing to the sidecar's dependencies."""
    import sys

    from tests.project.test_layout import PACKAGE, imports_of

    extra = {
        canonicalize_name(Requirement(r).name)
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["torch"]
    }
    package_root = ROOT / PACKAGE
    for path in sorted((package_root / "testing").glob("*.py")):
        third_party = {
            i.module.split(".")[0]
            for i in imports_of(path, package_root)
            if i.module.split(".")[0] not in sys.stdlib_module_names | {"__future__", PACKAGE}
        }
        allowed = extra | ({"pytest"} if path.name == "pytest_plugin.py" else set())
        assert third_party <= allowed, f"{path.name} imports {third_party - allowed}"
    assert not {"torch", "transformers", "pytest"} & set(dependencies()), "the sidecar's libraries stay as they are"
