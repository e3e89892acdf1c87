"""docs/architecture.md's "Four common changes": what each walk names is in the tree, and it names what its change touched.

A walk is a numbered checklist of files, the commands that regenerate what follows from them and the tests that catch
a missed step. Every path it names exists, every test it names (``file::name``) is defined, every command it names runs
here (a module with a ``__main__`` guard or package for ``python -m``, a script with one for ``python FILE``), and every
constant or class it names is written in a file its step names. ``TOUCHED`` is what making each change for real touched
(the scratch changes the walks were checked by); each walk must name all of it.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

from modelkv_testbed import ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"
HEADING = "## Four common changes"
PACKAGE = "modelkv_exporter/"

TOUCHED: dict[str, tuple[str, ...]] = {
    "A new snapshot field": (
        "contract/snapshot.py",
        "docs/snapshot.schema.json",
        "docs/snapshot-format.md",
        "engine/vllm_hook/lifecycle.py",
        "demo/engines.py",
        "testbed/modelkv_testbed/simulation/render.py",
        "tests/sidecar/golden/",
        "tests/sidecar/golden/memory-breakdown/",
        "sidecar/presentation/spool_report.py",
        "CHANGELOG.md",
    ),
    "A new metric": (
        "sidecar/catalogue.py",
        "sidecar/samples.py",
        "docs/metrics.md",
        "tests/sidecar/golden/",
        "deploy/prometheus/tests/",
        "CHANGELOG.md",
    ),
    "A setting's default": (
        "engine/config.py",
        "docs/configuration.md",
        "tests/engine/test_hook.py",
        "deploy/kubernetes/base/deployment.yaml",
        "docs/deploy.md",
        "CHANGELOG.md",
    ),
    "A new alert rule": (
        "deploy/prometheus/modelkv-rules.yaml",
        "deploy/prometheus/tests/declarations.test.yaml",
        "docs/runbook.md",
        "deploy/kubernetes/generate_manifests.py",
        "deploy/kubernetes/base/prometheusrule.yaml",
        "deploy/helm/modelkv-exporter/files/modelkv-rules.yaml",
        "deploy/helm/modelkv-exporter/templates/_rule-values.tpl",
        "deploy/helm/modelkv-exporter/values.yaml",
        "deploy/helm/modelkv-exporter/values.schema.json",
        "docs/deploy.md",
        "tests/deploy/test_rules.py",
        "tests/deploy/test_live_rules.py",
        "CHANGELOG.md",
    ),
}
"""Every file each change touched when it was made (a field ``example_field``, a gauge, ``MODELKV_SAMPLE_INTERVAL``
from 5 to 10, an alert on dropped declarations), with the tests it touches green; a folder stands for the generated
files in it (golden expositions, story files)."""


def walks(text: str) -> dict[str, str]:
    """Each ``### `` walk of the section by its heading, its text without the heading."""
    start = text.index(HEADING) + len(HEADING)
    end = text.find("\n## ", start)
    section = text[start : end if end != -1 else len(text)]
    return {m.group(1): m.group(2) for m in re.finditer(r"(?ms)^### ([^\n]+)\n(.*?)(?=^### |\Z)", section)}


def steps(walk: str) -> list[str]:
    """The numbered steps of a walk."""
    return [m.group(1) for m in re.finditer(r"(?ms)^\d+\. (.*?)(?=^\d+\. |\Z)", walk)]


def quoted(text: str) -> list[str]:
    """What the text writes in backticks (a step's lines joined)."""
    return re.findall(r"`([^`]+)`", re.sub(r"\s*\n\s*", " ", text))


def _exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path)) or any((ROOT / PACKAGE).glob(path))
    return (ROOT / path).exists() or (ROOT / PACKAGE / path).exists()


def _file(path: str) -> Path | None:
    for candidate in (ROOT / path, ROOT / PACKAGE / path):
        if candidate.is_file():
            return candidate
    return None


def _runs_as_main(source: Path) -> bool:
    return re.search(r'(?m)^if __name__ == "__main__":', source.read_text()) is not None


def command_problems(command: str) -> list[str]:
    """Why ``command`` (``[VAR=value ...] python -m MODULE ...`` or ``python FILE ...``) would not run here."""
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words.pop(0)
    if len(words) < 2 or words[0] != "python":
        return [f"{command}: not a python command"]
    if words[1] == "-m":
        module, arguments = words[2], words[3:]
        local = [ROOT / Path(*module.split(".")), ROOT / "testbed" / Path(*module.split("."))]
        found = [p.with_suffix(".py") for p in local if p.with_suffix(".py").is_file()]
        found += [p / "__main__.py" for p in local if (p / "__main__.py").is_file()]
        if found:
            problems = [] if _runs_as_main(found[0]) or found[0].name == "__main__.py" else [f"{module}: no __main__"]
        else:
            is_local = (ROOT / module.split(".")[0]).is_dir()
            missing = is_local or importlib.util.find_spec(module) is None
            problems = [f"{command}: no module {module}"] if missing else []
    else:
        script, arguments = words[1], words[2:]
        source = ROOT / script
        if not source.is_file():
            return [f"{command}: no script {script}"]
        problems = [] if _runs_as_main(source) else [f"{script}: no __main__"]
    return problems + [f"{command}: no {a}" for a in arguments if "/" in a and not _exists(a)]


def walk_problems(walk: str) -> list[str]:
    """Every path, test, command and name the walk writes that the tree does not have, one line each."""
    problems: list[str] = []
    for step in steps(walk):
        step_files = [f for f in (_file(q.split("::")[0]) for q in quoted(step) if " " not in q) if f is not None]
        for item in quoted(step):
            if item.startswith("python ") or re.match(r"[A-Z_]+=\S* python ", item):
                problems += command_problems(item)
            elif " " in item:
                continue
            elif "::" in item:
                path, name = item.split("::", 1)
                source = _file(path)
                if source is None or not re.search(rf"(?m)^def {re.escape(name)}\(", source.read_text()):
                    problems.append(f"{item}: no such test")
            elif "/" in item and not item.startswith(("http", "/")):
                if not _exists(item):
                    problems.append(f"{item}: no such path")
            elif re.fullmatch(r"[A-Z][A-Z0-9_]{2,}|[A-Z][a-z]+(?:[A-Z][a-z]+)+|[A-Z][a-z]{3,}", item):
                if not any(re.search(rf"\b{re.escape(item)}\b", f.read_text()) for f in step_files):
                    problems.append(f"{item}: in none of its step's files")
    return problems


def unnamed(walk: str, touched: tuple[str, ...]) -> list[str]:
    """The files of ``touched`` the walk does not name (a path inside the package may drop ``modelkv_exporter/``)."""
    text = re.sub(r"\s*\n\s*", " ", walk)
    return [path for path in touched if not re.search(rf"(?<![\w/.-]){re.escape(path)}(?![\w/-]|\.\w)", text)]


def test_the_section_has_the_four_walks_each_a_numbered_checklist() -> None:
    found = walks(ARCHITECTURE.read_text())
    assert list(found) == list(TOUCHED)
    for name, walk in found.items():
        assert len(steps(walk)) >= 4, name
        commands = [q for q in quoted(walk) if "python " in q]
        tests = [q for q in quoted(walk) if "::" in q]
        assert commands and tests, f"{name}: a walk names the commands that regenerate and the tests that catch"


def test_every_path_test_command_and_name_a_walk_writes_is_in_the_tree() -> None:
    problems = {name: walk_problems(walk) for name, walk in walks(ARCHITECTURE.read_text()).items()}
    assert {name: found for name, found in problems.items() if found} == {}


def test_each_walk_names_every_file_its_change_touched() -> None:
    found = walks(ARCHITECTURE.read_text())
    missing = {name: unnamed(found[name], touched) for name, touched in TOUCHED.items()}
    assert {name: paths for name, paths in missing.items() if paths} == {}


def test_the_checks_catch_what_they_are_for() -> None:
    """A walk that names a missing path, test, module, script or constant, or leaves out a touched file, is caught."""
    walk = (
        "1. `contract/gone.py`: x. Test: `tests/deploy/test_rules.py::test_no_such_test`.\n"
        "2. Run `python -m scripts.no_such_tool` and `python -m modelkv_exporter.sidecar.catalogue` and\n"
        "   `python deploy/no_such_script.py` and `python -m pytest tests/sidecar/test_gone.py`.\n"
        "3. `deploy/kubernetes/generate_manifests.py`: `NO_SUCH_TABLE` and `RULE_VALUES`.\n"
    )
    assert walk_problems(walk) == [
        "contract/gone.py: no such path",
        "tests/deploy/test_rules.py::test_no_such_test: no such test",
        "python -m scripts.no_such_tool: no module scripts.no_such_tool",
        "modelkv_exporter.sidecar.catalogue: no __main__",
        "python deploy/no_such_script.py: no script deploy/no_such_script.py",
        "python -m pytest tests/sidecar/test_gone.py: no tests/sidecar/test_gone.py",
        "NO_SUCH_TABLE: in none of its step's files",
    ]
    good = (
        "1. `sidecar/catalogue.py`: a `Metric` row; run `MODELKV_UPDATE_GOLDEN=1 python -m pytest "
        "tests/sidecar/test_golden.py`,\n   `python -m scripts.docgen`, `python -m modelkv_testbed.simulation.generate`,"
        " `python deploy/kubernetes/generate_manifests.py`.\n"
    )
    assert walk_problems(good) == []
    assert unnamed(good, ("sidecar/catalogue.py", "sidecar/samples.py", "tests/sidecar/")) == [
        "sidecar/samples.py",
        "tests/sidecar/",
    ]
