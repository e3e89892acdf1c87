"""Shared fixtures: snapshots built without torch, free ports, and a real sidecar process."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from modelkv_exporter import arithmetic
from modelkv_exporter.snapshot import (
    Declaration,
    EngineIdentity,
    EngineSettings,
    Measured,
    MemorySample,
    Snapshot,
)

ROOT = Path(__file__).resolve().parent.parent
FULL_SCALE = os.environ.get("MODELKV_TEST_SCALE") == "full"
"""bench/reliability.sh sets MODELKV_TEST_SCALE=full: the reliability tests then run at the issue's full size."""
VENV_BIN = Path(sys.executable).parent


def make_declaration(
    name: str = "cache",
    *,
    owner: str = "decoder",
    layers: int = 8,
    kv_heads: int = 16,
    head_dim: int = 64,
    positions: int = 71,
    element_size: int = 4,
    rows: str = arithmetic.MAX_NUM_SEQS,
    rows_fixed: int = 1,
    max_num_seqs: int = 8,
    scope: str = "request",
    capacity_source: str = "sliding_window(72) - 1",
) -> Declaration:
    """A self-consistent declaration resolved at ``max_num_seqs``."""
    per_row = arithmetic.bytes_per_row(
        layers=layers, kv_heads=kv_heads, head_dim=head_dim, positions=positions, element_size=element_size
    )
    count = arithmetic.row_count(rows, rows_fixed, max_num_seqs)
    return Declaration(
        owner=owner,
        owner_class="Owner",
        name=name,
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype={2: "bfloat16", 4: "float32"}.get(element_size, "float64"),
        element_size=element_size,
        physical_capacity_positions=positions,
        capacity_source=capacity_source,
        scope=scope,
        rows=rows,
        rows_fixed=rows_fixed,
        rows_reason="because" if rows == arithmetic.FIXED else "",
        allocation_note=None,
        bytes_per_row=per_row,
        row_count=count,
        peak_bytes=per_row * count,
    )


def make_snapshot(
    engine_id: str = "engine-a",
    *,
    declarations: tuple[Declaration, ...] | None = None,
    max_num_seqs: int = 8,
    heartbeat_at: float | None = None,
    interval: float | None = None,
    measured: dict[str, int] | None = None,
    baseline: dict[str, int] | None = None,
    **identity: object,
) -> Snapshot:
    """A valid snapshot for engine ``engine_id``."""
    now = time.time() if heartbeat_at is None else heartbeat_at
    if declarations is None:
        declarations = (make_declaration(max_num_seqs=max_num_seqs),)
    return Snapshot(
        engine=EngineIdentity(
            engine_id=engine_id, served_model_name=identity.pop("served_model_name", "m"), **identity
        ),  # type: ignore[arg-type]
        settings=EngineSettings(max_num_seqs=max_num_seqs),
        declarations=declarations,
        started_at=now - 10,
        heartbeat_at=now,
        heartbeat_interval_seconds=interval,
        measured=Measured(
            current=None if measured is None else MemorySample(now, measured),
            baseline=None if baseline is None else MemorySample(now - 5, baseline),
        ),
        writer="tests",
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Sidecar:
    """A running ``modelkv-exporter serve`` process."""

    process: subprocess.Popen[bytes]
    url: str
    spool_dir: Path

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        """GET ``path`` from the sidecar."""
        return httpx.get(self.url + path, timeout=10, **kwargs)  # type: ignore[arg-type]


def wait_http(url: str, timeout: float = 30.0, process: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until ``url`` answers 200, failing early if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


def start_sidecar(spool_dir: Path, *extra: str, executable: Path | None = None) -> Sidecar:
    """Start the real CLI on 127.0.0.1 and wait for /healthz."""
    port = free_port()
    exe = executable or VENV_BIN / "modelkv-exporter"
    process = subprocess.Popen(
        [
            str(exe),
            "serve",
            "--spool-dir",
            str(spool_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    sidecar = Sidecar(process, f"http://127.0.0.1:{port}", spool_dir)
    try:
        wait_http(sidecar.url + "/healthz", process=process)
    except Exception:
        process.kill()
        output = process.communicate()[0].decode(errors="replace")
        raise RuntimeError(f"sidecar did not start:\n{output}") from None
    return sidecar


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Terminate, then kill if needed."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    """An empty spool directory."""
    path = tmp_path / "spool"
    path.mkdir()
    return path


@pytest.fixture
def sidecar(spool: Path) -> Iterator[Sidecar]:
    """A real sidecar process serving ``spool`` on 127.0.0.1."""
    running = start_sidecar(spool)
    yield running
    stop_process(running.process)


def require_tool(name: str) -> str:
    """The path of a required external tool; a missing one fails the test (the test command installs it)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; run the README's test command, which installs it")
    return path


def scrape_config(jobs: Mapping[str, str], *, rule_files: tuple[Path, ...] = (), extra: str = "") -> str:
    """A Prometheus configuration scraping each job's base URL every second."""
    lines = ["global: {scrape_interval: 1s, evaluation_interval: 1s}"]
    if rule_files:
        lines.append("rule_files: [" + ", ".join(f"'{p}'" for p in rule_files) + "]")
    lines.append("scrape_configs:")
    for job, url in jobs.items():
        lines.append(f"  - job_name: {job}\n    static_configs: [{{targets: ['{url.removeprefix('http://')}']}}]")
    return "\n".join(lines) + "\n" + extra


@contextmanager
def running_prometheus(tmp_path: Path, config: str) -> Iterator[str]:
    """A real Prometheus (the Debian package) on 127.0.0.1 with ``config``; yields its base URL."""
    binary = require_tool("prometheus")
    port = free_port()
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(config)
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/-/ready", timeout=60, process=process)
        yield url
    finally:
        stop_process(process)


def query(prometheus: str, promql: str, at: float | None = None) -> list[dict]:
    """An instant query through Prometheus's HTTP API; fails the test on an error response."""
    params = {"query": promql} if at is None else {"query": promql, "time": str(at)}
    response = httpx.get(prometheus + "/api/v1/query", params=params, timeout=10)
    assert response.status_code == 200, f"{promql}: {response.text}"
    result: list[dict] = response.json()["data"]["result"]
    return result


def chromium() -> str:
    """The headless Chromium binary (Debian's chromium-headless-shell, or a full chromium)."""
    for name in ("chromium-headless-shell", "chromium"):
        path = shutil.which(name)
        if path:
            return path
    return require_tool("chromium-headless-shell")


def chromium_run(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Load ``url`` in headless Chromium with ``args`` (e.g. ``--dump-dom``); no network beyond the URL."""
    return subprocess.run(
        [
            chromium(),
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
