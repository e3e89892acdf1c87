"""The sidecar needs neither torch nor vLLM: it imports neither (tests/test_docker.py installs and serves it without them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    "modelkv_exporter.api",
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


def test_scrapes_and_probes_never_load_fastapi(tmp_path: Path) -> None:
    """FastAPI and pydantic are most of the sidecar's memory: they load only when a person or tool needs them."""
    code = f"""
import asyncio, sys
from pathlib import Path
from modelkv_exporter.app import SidecarConfig, create_app

app = create_app(SidecarConfig(Path({str(tmp_path)!r})))
sent = []

async def receive():
    return {{"type": "http.request", "body": b"", "more_body": False}}

async def send(message):
    sent.append(message)

async def get(path):
    sent.clear()
    scope = {{"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b"", "root_path": ""}}
    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

async def main():
    status, body = await get("/metrics")
    assert status == 200 and b"modelkv_exporter_build_info" in body
    assert await get("/healthz") == (200, b"ok\\n")
    print(sorted(m for m in sys.modules if m.split(".")[0] in ("fastapi", "pydantic", "starlette")))
    status, body = await get("/")
    assert status == 200 and b"modelkv-exporter" in body
    print("fastapi" in sys.modules)

asyncio.run(main())
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "True"]
