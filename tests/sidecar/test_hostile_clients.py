"""Hostile HTTP clients against the real sidecar process: every limit answered at its edge, counted, never a hang.

The sidecar runs with small limits (flags) so each case is quick; bench/attack.py runs the
same attacks at the issue's sizes. Raw sockets send what no HTTP library would.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.polling import eventually
from modelkv_testbed.processes import Sidecar, start_sidecar, stop_process
from modelkv_testbed.snapshots import make_declaration, make_snapshot

LIMITS = (
    "--http-max-connections", "16",
    "--http-max-line-bytes", "1KiB",
    "--http-max-header-bytes", "4KiB",
    "--http-max-headers", "20",
    "--http-max-body-bytes", "2KiB",
    "--http-header-timeout", "1",
    "--http-idle-timeout", "0.5",
    "--http-send-timeout", "2",
)  # fmt: skip


@pytest.fixture
def guarded(spool: Path) -> Iterator[Sidecar]:
    write_snapshot(spool, make_snapshot("e"))
    running = start_sidecar(spool, *LIMITS)
    yield running
    stop_process(running.process)


def connect(sidecar: Sidecar) -> socket.socket:
    host, port = sidecar.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def exchange(sidecar: Sidecar, data: bytes) -> bytes:
    """Send ``data`` and read until the server closes (bounded by the socket timeout)."""
    with connect(sidecar) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass  # the server may answer and close before it has read everything
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (ConnectionResetError, TimeoutError):
        pass
    return b"".join(chunks)


def read_response(sock: socket.socket) -> bytes:
    """One whole response with a content-length, from a connection that stays open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def refusals(sidecar: Sidecar) -> dict[str, float]:
    return Exposition(sidecar.get("/metrics").text).by("modelkv_exporter_http_refusals_total", "reason")


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def test_heads_are_bounded_at_their_edges(guarded: Sidecar) -> None:
    ok_line = b"GET /healthz?" + b"a" * (1024 - 9) + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    assert status(exchange(guarded, ok_line)) == 200, "a request target of exactly the limit is served"
    long_line = b"GET /healthz?" + b"a" * 1024 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    assert status(exchange(guarded, long_line)) == 414

    def head(headers: list[bytes]) -> bytes:
        return b"GET /healthz HTTP/1.1\r\nConnection: close\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"

    assert status(exchange(guarded, head([b"X-%d: v" % i for i in range(19)]))) == 200, "20 headers"
    assert status(exchange(guarded, head([b"X-%d: v" % i for i in range(20)]))) == 431, "21 headers"
    assert status(exchange(guarded, head([b"X: " + b"v" * 1000]))) == 200
    assert status(exchange(guarded, head([b"X: " + b"v" * 1100]))) == 431, "one header line past the line limit"
    # 5 headers of 900 bytes: each within the line limit, together past the head limit
    assert status(exchange(guarded, head([b"X-%d: " % i + b"v" * 900 for i in range(5)]))) == 431
    counted = refusals(guarded)
    assert counted["request_line_too_long"] == 1 and counted["headers_too_large"] == 3


def test_an_endless_head_is_refused_after_the_head_limit_not_buffered(guarded: Sidecar) -> None:
    with connect(guarded) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n")
        sent = 0
        answer = b""
        while sent < 64 * 1024 * 1024 and not answer:
            try:
                sock.sendall(b"X-a: b\r\n" * 8192)
            except OSError:
                break
            sent += 8 * 8192
            sock.setblocking(False)
            try:
                answer = sock.recv(4096)
            except BlockingIOError:
                pass
            sock.setblocking(True)
        answer += read_all(sock)
    assert status(answer) == 431
    assert sent < 8 * 1024 * 1024, f"the server stopped reading at the head limit, not after {sent} bytes"


def test_slow_and_silent_connections_are_closed(guarded: Sidecar) -> None:
    slow = connect(guarded)
    slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    silent = connect(guarded)
    for _ in range(15):  # a slowloris: a header line every 0.1 s keeps bytes coming, never the end
        try:
            slow.sendall(b"X-a: b\r\n")
        except OSError:
            break  # answered and closed
        time.sleep(0.1)
    answer = read_all(slow)
    assert status(answer) == 408, answer[:200]
    assert read_all(silent) == b"", "a connection that never sends is closed, unanswered"
    counted = refusals(guarded)
    assert counted["header_timeout"] == 1 and counted["silent_connection"] >= 1
    slow.close()
    silent.close()


def test_keep_alive_serves_and_then_closes_an_idle_connection(guarded: Sidecar) -> None:
    with connect(guarded) as sock:
        for _ in range(3):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status(read_response(sock)) == 200
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        pipelined = read_all(sock)
    assert pipelined.count(b"HTTP/1.1 200 OK") == 2, "pipelined requests answered in order, then idle close"


def test_bodies_are_refused_or_dropped_never_drained(guarded: Sidecar) -> None:
    huge = exchange(guarded, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n" + b"x" * 65536)
    assert status(huge) == 413
    declared = exchange(guarded, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
    assert status(declared) == 413, "a declared body past the limit: refused before a byte of it comes"
    chunk = b"400\r\n" + b"x" * 1024 + b"\r\n"
    chunked = b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 3
    assert status(exchange(guarded, chunked)) == 413, "a chunked body past the limit, whatever it declares"
    with connect(guarded) as sock:  # an unread chunked body, its length unknown: closed after the answer
        sock.sendall(chunked[: -len(chunk) * 2])
        assert status(read_response(sock)) == 405
        assert read_all(sock) == b""
    assert refusals(guarded)["body_not_read"] == 1
    with connect(guarded) as sock:  # a small unread body is dropped and the connection goes on
        sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        both = read_all(sock)
    assert both.count(b"HTTP/1.1 405") == 1 and both.count(b"HTTP/1.1 200") == 1
    with connect(guarded) as sock:  # a declared body trickled after the answer: closed, not waited for
        sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n" + b"x" * 10)
        assert status(read_response(sock)) == 405
        started = time.monotonic()
        trickled = 0
        try:
            while time.monotonic() - started < 10:
                sock.sendall(b"x")
                trickled += 1
                time.sleep(0.05)
        except OSError:
            pass
    assert trickled < 200, "the rest of the body had the idle timeout to come, then the connection closed"
    assert refusals(guarded)["body_too_large"] == 3


def test_the_connection_cap_evicts_idle_connections_and_refuses_when_none_is_idle(guarded: Sidecar) -> None:
    idle = [connect(guarded) for _ in range(16)]
    eventually(lambda: refusals(guarded)["evicted_idle"] >= 1, "the scrape's connection evicting an idle one")
    fresh = httpx.get(guarded.url + "/healthz")
    assert fresh.status_code == 200, "a new client is served while 16 idle connections are open"
    for sock in idle:
        sock.close()

    busy = []
    for _ in range(16):  # each mid-head: not idle, not evictable, until the head timeout
        sock = connect(guarded)
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        busy.append(sock)
    eventually(lambda: _refused_at_connect(guarded), "a connection closed unanswered at the cap")
    probe = httpx.get(guarded.probe_url + "/healthz")
    assert probe.status_code == 200, "the liveness port answers while the main port is full"
    for sock in busy:
        sock.close()
    eventually(lambda: httpx.get(guarded.url + "/healthz").status_code == 200, "the main port serving again")
    assert refusals(guarded)["too_many_connections"] >= 1


def _refused_at_connect(sidecar: Sidecar) -> bool:
    with connect(sidecar) as sock:
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        except OSError:
            return False
        return read_all(sock) == b""


def test_a_client_that_never_reads_its_response_is_cut_off(spool: Path) -> None:
    declarations = tuple(make_declaration(f"cache-{i}", owner=f"model.layers.{i}") for i in range(200))
    write_snapshot(spool, make_snapshot("big", declarations=declarations))
    running = start_sidecar(spool, "--http-idle-timeout", "0.5", "--http-send-timeout", "1")
    try:
        sockets = []
        for _ in range(4):
            sock = connect(running)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 100)  # pipelined: far more than buffers hold
            sockets.append(sock)
        eventually(lambda: refusals(running)["send_timeout"] >= 1, "a stalled response aborted", timeout=30)
        for sock in sockets:
            sock.close()
    finally:
        stop_process(running.process)


def test_stalled_readers_together_hold_no_more_than_the_unsent_limit(spool: Path) -> None:
    declarations = tuple(make_declaration(f"cache-{i}", owner=f"model.layers.{i}") for i in range(200))
    write_snapshot(spool, make_snapshot("big", declarations=declarations))
    running = start_sidecar(spool, "--http-max-unsent-bytes", "256KiB", "--http-send-timeout", "60")
    try:
        sockets = []
        for _ in range(8):
            sock = connect(running)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 100)
            sockets.append(sock)
        eventually(lambda: refusals(running)["unsent_bytes"] >= 1, "the heaviest stalled reader aborted")
        assert refusals(running)["send_timeout"] == 0, "the limit, not the timeout, cut it"
        for sock in sockets:
            sock.close()
    finally:
        stop_process(running.process)


def test_bad_requests_are_counted_and_the_log_is_rate_limited(guarded: Sidecar) -> None:
    for _ in range(300):
        assert status(exchange(guarded, b"GARBAGE\r\n\r\n")) == 400
    assert refusals(guarded)["invalid_request"] == 300
    lines = [line for line in guarded.output().splitlines() if "Invalid HTTP request" in line]
    assert 1 <= len(lines) < 30, f"{len(lines)} log lines for 300 bad requests"
    assert any("similar lines suppressed" in line for line in guarded.output().splitlines()) or len(lines) <= 5


def test_every_route_answers_head_and_nothing_serves_openapi(guarded: Sidecar) -> None:
    for path in ("/", "/metrics", "/healthz", "/readyz", "/api/v1/engines"):
        head = httpx.head(guarded.url + path)
        assert head.status_code == 200 and head.content == b"", path
        assert head.headers["x-content-type-options"] == "nosniff", path
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert guarded.get(path).status_code == 404, path
    probe = httpx.head(guarded.probe_url + "/healthz")
    assert probe.status_code == 200 and probe.content == b""
    assert httpx.get(guarded.probe_url + "/metrics").status_code == 404, "the liveness port serves /healthz only"
