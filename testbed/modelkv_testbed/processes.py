"""Processes the tests start: the real sidecar CLI on 127.0.0.1, and tools the test command installs."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from modelkv_exporter.sidecar.http.server import SidecarServer, build_server
from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig
from modelkv_testbed import VENV_BIN
from modelkv_testbed.polling import eventually


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
    probe_url: str = ""
    """The liveness listener (``--probe-port``)."""
    log: Path | None = None
    """Where the process's output goes."""

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        """GET ``path`` from the sidecar."""
        return httpx.get(self.url + path, timeout=10, **kwargs)  # type: ignore[arg-type]

    def output(self) -> str:
        """Everything the process wrote so far."""
        return self.log.read_text(errors="replace") if self.log else ""


def wait_http(url: str, timeout: float = 30.0, process: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until ``url`` answers 200, failing early if ``process`` exits."""

    def answered() -> bool:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered")
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    eventually(answered, f"{url} to answer", timeout=timeout, interval=0.1)


def start_sidecar(spool_dir: Path, *extra: str, executable: Path | None = None) -> Sidecar:
    """Start the real CLI on 127.0.0.1 (its liveness listener too) and wait for /healthz.

    Its output goes to a file beside the spool (``Sidecar.output()``), never to a pipe nobody reads.
    """
    port, probe_port = free_port(), free_port()
    exe = executable or VENV_BIN / "modelkv-exporter"
    log = spool_dir.parent / f"sidecar-{port}.log"
    with open(log, "wb") as out:
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
                "--probe-port",
                str(probe_port),
                "--log-level",
                "warning",
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    sidecar = Sidecar(process, f"http://127.0.0.1:{port}", spool_dir, f"http://127.0.0.1:{probe_port}", log)
    try:
        wait_http(sidecar.url + "/healthz", process=process)
    except Exception:
        process.kill()
        process.wait()
        raise RuntimeError(f"sidecar did not start:\n{sidecar.output()}") from None
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


@contextmanager
def serving(command: list[str], port: int, ready: str) -> Iterator[str]:
    """A server ``command`` listening on 127.0.0.1:``port``, from when its ``ready`` path answers to the block's end;
    yields its base URL. Its standard error is kept for ``wait_http`` to show should it exit before."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + ready, timeout=60, process=process)
        yield url
    finally:
        stop_process(process)


@dataclass
class InThread:
    """A real sidecar server (uvicorn, the app, its probe listener) running in a thread of this process."""

    server: SidecarServer
    url: str

    @property
    def probe_url(self) -> str:
        """The liveness listener's base URL."""
        assert self.server.probe is not None, "the server was built without a probe port"
        return f"http://127.0.0.1:{self.server.probe.port}"


@contextmanager
def serving_in_thread(
    config: SidecarConfig, prepare: Callable[[SidecarServer], None] | None = None, *, ready: str | None = "/healthz"
) -> Iterator[InThread]:
    """``config``'s sidecar on a free port of 127.0.0.1 in a thread, from when its ``ready`` path answers (at once
    when None) to the block's end.

    ``prepare`` sees the built server before it starts (a test's own limits). The server is asked to exit and
    joined at the end, so the next test finds its port and thread gone."""
    port = free_port()
    running = InThread(
        build_server(config, host="127.0.0.1", port=port, log_level="warning"), f"http://127.0.0.1:{port}"
    )
    if prepare is not None:
        prepare(running.server)
    thread = threading.Thread(target=running.server.run, daemon=True)
    thread.start()
    try:
        if ready is not None:
            wait_http(running.url + ready)
        yield running
    finally:
        running.server.should_exit = True
        thread.join(timeout=10)


def require_tool(name: str) -> str:
    """The path of a required external tool; a missing one fails the test (the test command installs it)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; run the README's test command, which installs it")
    return path
