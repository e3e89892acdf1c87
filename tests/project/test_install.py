"""What each install brings: the base install depends on nothing; the sidecar's libraries come with ``[sidecar]``.

The base install is what goes into an engine's environment (the vLLM plugin needs the standard library and what vLLM
brings), so it must leave the engine's own packages as they are. ``serve`` and the demo without their extra say so in
one line; ``inspect``, ``plan`` and ``check`` need only the standard library.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import tomllib

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_testbed import ROOT
from modelkv_testbed.snapshots import make_snapshot

SIDECAR_MODULES = ("prometheus_client", "fastapi", "starlette", "uvicorn", "uvloop", "httptools", "pydantic")

HIDE = f"""
import sys
for name in {SIDECAR_MODULES!r}:
    sys.modules[name] = None  # an import of it raises ModuleNotFoundError, as where it is not installed
from modelkv_exporter.cli import main
sys.exit(main(sys.argv[1:]))
"""


def cli_without_sidecar_libraries(*arguments: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELKV_")}
    return subprocess.run(
        [sys.executable, "-c", HIDE, *arguments], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )


def test_the_base_install_depends_on_nothing() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == [], "an engine's environment gets nothing it may already pin"
    assert {"prometheus-client", "fastapi", "uvicorn"} <= {
        r.split(">")[0].split("<")[0].split(";")[0].strip() for r in project["optional-dependencies"]["sidecar"]
    }


@pytest.mark.parametrize("command,extras", [("serve", "sidecar"), ("demo", "sidecar,torch")])
def test_a_command_without_its_extra_says_so_in_one_line(tmp_path: Path, command: str, extras: str) -> None:
    result = cli_without_sidecar_libraries(command, "--spool-dir", str(tmp_path), "--port", "0")
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"modelkv-exporter {command}: ") and "not installed" in line, line
    assert line.endswith(f"pip install 'modelkv-exporter[{extras}]'"), line


def test_inspect_plan_and_check_need_no_extra(tmp_path: Path) -> None:
    write_snapshot(tmp_path, make_snapshot("engine-a"))
    for arguments in (("inspect",), ("plan", "--max-num-seqs", "16"), ("check",)):
        result = cli_without_sidecar_libraries(*arguments, str(tmp_path))
        assert result.returncode in (0, 1) and "engine-a" in result.stdout, (arguments, result.stderr[-2000:])
        assert "Traceback" not in result.stderr


def pip(python: Path, *arguments: str) -> str:
    result = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input", *arguments],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"pip {' '.join(arguments)}:\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
    return result.stdout


def frozen(python: Path) -> set[str]:
    """``name==version`` of every distribution installed."""
    return {f"{d['name'].lower()}=={d['version']}" for d in json.loads(pip(python, "list", "--format=json"))}


@pytest.mark.slow
def test_installing_beside_a_newer_fastapi_downgrades_nothing(tmp_path: Path) -> None:
    """An environment with the newest FastAPI from the index (newer than the sidecar's cap, as an engine may pin it):
    installing the package changes nothing there but adding it; with ``[sidecar]`` pip would downgrade FastAPI."""
    environment = tmp_path / "engine-env"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    pip(python, "install", "-q", "fastapi")
    before = frozen(python)
    (fastapi,) = [line for line in before if line.startswith("fastapi==")]
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):  # what the Dockerfile builds its wheel from
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "modelkv_exporter", source / "modelkv_exporter", ignore=shutil.ignore_patterns("__pycache__")
    )
    pip(python, "wheel", "-q", "--no-deps", "--wheel-dir", str(tmp_path / "dist"), str(source))
    (wheel,) = (tmp_path / "dist").glob("*.whl")

    pip(python, "install", "-q", str(wheel))
    after = frozen(python)
    assert before - after == set(), f"changed by the install: {sorted(before - after)} -> {sorted(after - before)}"
    assert {line.partition("==")[0] for line in after - before} == {"modelkv-exporter"}

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["sidecar"]
    cap = next(r for r in extra if r.startswith("fastapi"))
    report = json.loads(pip(python, "install", "-q", "--dry-run", "--report", "-", f"{wheel}[sidecar]"))
    with_extra = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    assert with_extra.get("fastapi") and f"fastapi=={with_extra['fastapi']}" != fastapi.lower(), (
        f"the check can fail: with the extra, pip replaces {fastapi} to meet {cap}"
    )

    cli = environment / "bin" / "modelkv-exporter"
    served = subprocess.run(
        [str(cli), "serve", "--spool-dir", str(tmp_path), "--port", "0"], capture_output=True, text=True, timeout=60
    )
    (line,) = served.stderr.splitlines()
    assert (
        served.returncode == 2
        and "prometheus-client" in line
        and "uvicorn" in line
        and "fastapi" not in line.split(";")[0]
    ), line
    (tmp_path / "spool").mkdir()
    write_snapshot(tmp_path / "spool", make_snapshot("engine-a"))
    inspected = subprocess.run(
        [str(cli), "inspect", str(tmp_path / "spool")], capture_output=True, text=True, timeout=60
    )
    assert inspected.returncode == 0 and "engine-a" in inspected.stdout, inspected.stderr[-2000:]
