"""A taken port ends ``serve`` and the demo with one line naming it, and a suggestion that is free and not the
liveness port; ``serve`` logs its liveness port, and every line it logs, uvicorn's too, in one format."""

from __future__ import annotations

import errno
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from modelkv_exporter.cli.ports import free_port_near, listening_socket
from modelkv_exporter.sidecar.http.sidecar_config import PROBE_PORT
from modelkv_testbed import VENV_BIN
from modelkv_testbed.polling import eventually
from modelkv_testbed.processes import free_port, stop_process

LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S")
"""The one format of ``serve``'s log lines: time, level, logger, message."""


@contextmanager
def taken(port: int = 0) -> Iterator[int]:
    """``port`` on 127.0.0.1 held by a listening socket (a port already held by another process counts as taken)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError as error:
            assert error.errno == errno.EADDRINUSE and port, error
            yield port
            return
        yield int(sock.getsockname()[1])


def bindable(port: int) -> bool:
    try:
        listening_socket("127.0.0.1", port).close()
    except OSError:
        return False
    return True


def run_cli(*argv: str, spool: Path) -> subprocess.CompletedProcess[str]:
    spool.mkdir(exist_ok=True)
    command = [str(VENV_BIN / "modelkv-exporter"), *argv, "--spool-dir", str(spool), "--host", "127.0.0.1"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def suggested(stderr: str, flag: str) -> int:
    found = re.search(rf"for example: {flag}[ =](\d+)", stderr)
    assert found, stderr
    return int(found.group(1))


def test_a_taken_liveness_port_ends_serve_with_one_line_naming_it(tmp_path: Path) -> None:
    port = free_port()
    with taken() as probe:
        result = run_cli("serve", "--port", str(port), "--probe-port", str(probe), spool=tmp_path / "spool")
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"cannot listen on 127.0.0.1:{probe}, its liveness probe port" in result.stderr
        assert "--probe-port or MODELKV_PROBE_PORT" in result.stderr
        other = suggested(result.stderr, "--probe-port")
        assert other not in (probe, port) and bindable(other)
    assert bindable(port), "the HTTP port bound first is closed again"


def test_a_taken_liveness_port_named_by_its_variable_is_the_same_error(tmp_path: Path) -> None:
    with taken() as probe:
        command = [str(VENV_BIN / "modelkv-exporter"), "serve", "--host", "127.0.0.1", "--port", "0"]
        env = {**os.environ, "MODELKV_SPOOL_DIR": str(tmp_path), "MODELKV_PROBE_PORT": str(probe)}
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"127.0.0.1:{probe}, its liveness probe port" in result.stderr


def test_a_taken_http_port_ends_serve_with_one_line_naming_it(tmp_path: Path) -> None:
    probe = free_port()
    with taken() as port:
        result = run_cli("serve", "--port", str(port), "--probe-port", str(probe), spool=tmp_path / "spool")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}, its HTTP port" in result.stderr
    assert "--port or MODELKV_PORT" in result.stderr
    assert suggested(result.stderr, "--port") not in (port, probe, PROBE_PORT)


def test_the_demo_never_suggests_the_liveness_port(tmp_path: Path) -> None:
    """With 9400 taken, the port above it is 9401, the sidecar's liveness port: the suggestion passes over it."""
    with taken(9400):
        result = run_cli("demo", "--port", "9400", spool=tmp_path / "spool")
        other = suggested(result.stderr, "MODELKV_PORT")
        assert result.returncode == 2 and "make demo" in result.stderr, result.stderr
        assert other != PROBE_PORT and other != 9400 and bindable(other), result.stderr


def test_a_taken_liveness_port_ends_the_demo_before_any_engine_starts(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    with taken() as probe:
        command = [str(VENV_BIN / "modelkv-exporter"), "demo", "--spool-dir", str(spool), "--host", "127.0.0.1"]
        result = subprocess.run(
            [*command, "--port", "0", "--probe-port", str(probe)], capture_output=True, text=True, timeout=60
        )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"demo: cannot listen on 127.0.0.1:{probe}, its liveness probe port" in result.stderr
    assert "--probe-port or MODELKV_PROBE_PORT" in result.stderr and result.stderr.count("\n") == 1
    assert "starting" not in result.stdout and not spool.exists(), "no engine was started"


def test_a_suggestion_passes_over_taken_and_avoided_ports() -> None:
    with taken() as port, taken(port + 1):
        avoided = port + 2
        other = free_port_near("127.0.0.1", port, {avoided})
        assert other not in (port, port + 1, avoided) and bindable(other)
        assert free_port_near("127.0.0.1", port, set()) != port + 1, "a taken port is never suggested"


def test_serve_logs_its_liveness_port_in_the_one_format_uvicorn_logs_in_too(tmp_path: Path) -> None:
    port, probe = free_port(), free_port()
    log = tmp_path / "serve.log"
    command = [str(VENV_BIN / "modelkv-exporter"), "serve", "--spool-dir", str(tmp_path / "missing")]
    command += ["--host", "127.0.0.1", "--port", str(port), "--probe-port", str(probe), "--log-level", "info"]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        eventually(lambda: "Application startup complete" in log.read_text(), "uvicorn's start-up line", timeout=60)
    finally:
        stop_process(process)
    lines = log.read_text().splitlines()
    assert lines and all(LOG_LINE.match(line) for line in lines), "\n".join(lines)
    assert any(f"liveness probes: GET /healthz on 127.0.0.1:{probe}" in line for line in lines), "\n".join(lines)
    assert any(" uvicorn." in line for line in lines) and any(" modelkv_exporter" in line for line in lines)
