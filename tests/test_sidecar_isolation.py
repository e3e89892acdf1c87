"""The sidecar needs neither torch nor vLLM: it imports neither (tests/test_docker.py installs and serves it without them)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

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
    "modelkv_exporter.landing",
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
