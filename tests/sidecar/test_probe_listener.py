"""The liveness listener against hostile clients on its own port: every kubelet probe still answers.

The listener runs on a real socket on 127.0.0.1 with a heartbeat that has beaten (a serving
sidecar); hostile clients and a kubelet-like prober are threads of this process on raw sockets.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from modelkv_exporter.sidecar.http.liveness_port import DEADLINE_SECONDS, MAX_CONNECTIONS, Heartbeat, ProbeListener
from modelkv_testbed import ROOT
from modelkv_testbed.polling import eventually

KUBELET_REQUEST = (
    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:9401\r\nUser-Agent: kube-probe/1.29\r\n"
    b"Accept: */*\r\nConnection: close\r\n\r\n"
)
PROBE_TIMEOUT = 1.0
"""The manifest's tightest probe timeout: the startupProbe's ``timeoutSeconds``, unset, is the kubelet's default 1 s."""
PROBE_PERIOD = 0.25
PROBES = 12
TRICKLE_SECONDS = 0.9
"""Under the old listener's one-second timeout per ``recv``: a byte this often held it for good."""
TRICKLERS = 4
IDLE_CONNECTIONS = MAX_CONNECTIONS + 36


@pytest.fixture
def listener() -> Iterator[ProbeListener]:
    heartbeat = Heartbeat()
    heartbeat.last = time.monotonic()
    with serving(ProbeListener("127.0.0.1", 0, heartbeat)) as probe:
        yield probe


@contextmanager
def serving(probe: ProbeListener) -> Iterator[ProbeListener]:
    """``probe`` started, and stopped when the test ends."""
    probe.start()
    try:
        yield probe
    finally:
        probe.stop()


@dataclass
class Outcome:
    """One probe: when it started (seconds into the run), what it got, how long it took."""

    at: float
    result: str
    seconds: float


def kubelet_probe(port: int, timeout: float) -> str:
    """A kubelet's HTTP probe: connect, ask, read to the close, all within ``timeout``; the status or the error."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(KUBELET_REQUEST)
            response = b""
            while True:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = sock.recv(4096)
                if not chunk:
                    break
                response += chunk
    except OSError as error:
        return type(error).__name__
    if not response.startswith(b"HTTP/1.1 "):
        return f"answer {response[:20]!r}" if response else "closed unanswered"
    return response.split(b" ", 2)[1].decode()


class Trickler:
    """A client that sends one byte of an endless head every ``TRICKLE_SECONDS``, and reconnects when cut off."""

    def __init__(self, port: int, stop: threading.Event) -> None:
        self.port = port
        self.stop = stop
        self.bytes_sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                    for byte in b"GET /healthz HTTP/1.1\r\nX-a: " + b"a" * 100_000:
                        sock.sendall(bytes([byte]))
                        self.bytes_sent += 1
                        if self.stop.wait(TRICKLE_SECONDS):
                            return
            except OSError:
                self.stop.wait(0.01)


def idle_connection(port: int) -> socket.socket:
    """A connection that sends nothing; connected without blocking, so a full accept queue cannot hold the test."""
    sock = socket.socket()
    sock.setblocking(False)
    sock.connect_ex(("127.0.0.1", port))
    return sock


def test_trickling_silent_and_idle_clients_never_fail_a_kubelet_probe(listener: ProbeListener) -> None:
    """Every probe answers 200 within the manifest's timeout while hostile clients hold the probe port.

    The manifest probes every 2 s (startup, 1 s timeout) and every 20 s (liveness, 5 s timeout);
    here a probe goes every 0.25 s with the 1 s timeout, so a 3 s run asks as many probes as
    24 s of startup probing, each held to the tightest timeout. Whether a probe is answered in
    time depends on what the hostile clients hold at that moment, not on how long ago the last
    probe was, so the shorter period only samples more often. The idle connections go past the
    cap, closing the oldest (the tricklers' first ones, which come back), and the run crosses
    the per-connection deadline, so connections are cut off while probes run.

    Shown failing on the listener before issue 22 (one connection at a time, a one-second
    timeout per ``recv``): the first trickler held it, and all 12 probes ended in
    ``TimeoutError`` after 1 s, with or without the idle connections. Shown failing too with
    the cap closing new connections instead of the oldest: the 8 probes of the first 2 s (until
    the idle connections' deadline) were closed unanswered or reset.
    """
    stop = threading.Event()
    tricklers = [Trickler(listener.port, stop) for _ in range(TRICKLERS)]
    for trickler in tricklers:
        trickler.thread.start()
    eventually(lambda: all(t.bytes_sent for t in tricklers), "every trickler connected and trickling", timeout=10)
    silent = socket.create_connection(("127.0.0.1", listener.port), timeout=5)
    idle = [idle_connection(listener.port) for _ in range(IDLE_CONNECTIONS)]
    outcomes = []
    try:
        start = time.monotonic()
        for index in range(PROBES):
            next_probe = start + index * PROBE_PERIOD
            time.sleep(max(next_probe - time.monotonic(), 0))  # the prober's cadence, not a wait for the server
            began = time.monotonic()
            result = kubelet_probe(listener.port, PROBE_TIMEOUT)
            outcomes.append(Outcome(round(began - start, 2), result, round(time.monotonic() - began, 3)))
    finally:
        stop.set()
        for trickler in tricklers:
            trickler.thread.join(timeout=5)
        silent.close()
        for sock in idle:
            sock.close()
    print(*outcomes, sep="\n")
    assert [o.result for o in outcomes] == ["200"] * PROBES, outcomes
    assert all(t.bytes_sent > 1 for t in tricklers), "every trickler trickled through the run"


def test_a_trickler_is_cut_off_unanswered_at_the_deadline(listener: ProbeListener) -> None:
    """A head that never ends holds its connection for ``DEADLINE_SECONDS`` from the accept, however often bytes come.

    Shown failing with the deadline taken away (``_expire`` doing nothing): held 3.59 s, still open.
    """
    received = b""
    started = time.monotonic()
    give_up = started + DEADLINE_SECONDS + 1.5
    head = iter(b"GET /healthz HTTP/1.1\r\nX-a: " + b"a" * 100_000)
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as sock:
        sock.settimeout(0.1)  # a byte every 0.1 s, and a look for the close between bytes
        while time.monotonic() < give_up:
            try:
                sock.sendall(bytes([next(head)]))
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except ConnectionError:
                break
            if not chunk:
                break
            received += chunk
    held = time.monotonic() - started
    assert received == b"", "cut off, not answered"
    assert DEADLINE_SECONDS - 0.1 <= held < DEADLINE_SECONDS + 1.5, f"held {held:.2f} s"


def test_past_the_cap_a_new_connection_closes_the_oldest_and_is_served() -> None:
    """The cap bounds what is open without ever turning a probe away: the oldest connection goes.

    Shown failing with the cap closing the new connection instead: the probe got ``ConnectionResetError``.
    """
    heartbeat = Heartbeat()
    heartbeat.last = time.monotonic()
    with serving(ProbeListener("127.0.0.1", 0, heartbeat, deadline=60, max_connections=4)) as probe:
        oldest = socket.create_connection(("127.0.0.1", probe.port), timeout=10)
        others = [socket.create_connection(("127.0.0.1", probe.port), timeout=10) for _ in range(3)]
        assert kubelet_probe(probe.port, timeout=5) == "200", "the fifth connection is served"
        assert oldest.recv(1) == b"", "the oldest was closed for it (long before its 60 s deadline)"
        for sock in (oldest, *others):
            sock.close()


class HeldHeartbeat(Heartbeat):
    """A heartbeat that has beaten, whose first reading holds the listener's thread until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.last = time.monotonic()
        self.entered, self.release = threading.Event(), threading.Event()

    def age(self) -> float:
        """0, once ``release`` is set."""
        self.entered.set()
        self.release.wait(10)
        return 0.0


def test_a_probe_closed_for_a_newer_connection_is_answered_first() -> None:
    """A probe's head that is already there when its connection is evicted gets its answer, not a close.

    The listener is held answering one request while a probe and two more connections queue
    (cap 2): once released, it accepts all three in one batch and the third evicts the probe
    before the probe's turn to be read. Shown failing with the last read taken out of
    ``_evict_oldest``: the probe got ``ConnectionResetError``, no answer.
    """
    heartbeat = HeldHeartbeat()
    with serving(ProbeListener("127.0.0.1", 0, heartbeat, deadline=60, max_connections=2)) as probe:
        first = socket.create_connection(("127.0.0.1", probe.port), timeout=10)
        first.sendall(KUBELET_REQUEST)
        assert heartbeat.entered.wait(10), "the listener is answering the first request"
        queued = socket.create_connection(("127.0.0.1", probe.port), timeout=10)
        queued.sendall(KUBELET_REQUEST)
        newer = [socket.create_connection(("127.0.0.1", probe.port), timeout=10) for _ in range(2)]
        heartbeat.release.set()
        for sock in (first, queued):
            response = b""
            while chunk := sock.recv(4096):
                response += chunk
            assert response.startswith(b"HTTP/1.1 200 OK\r\n"), response
        for sock in (first, queued, *newer):
            sock.close()


def test_the_answers_of_the_liveness_port() -> None:
    heartbeat = Heartbeat()
    with serving(ProbeListener("127.0.0.1", 0, heartbeat, max_stall=30)) as probe:
        assert exchange(probe.port, KUBELET_REQUEST).endswith(b"\r\n\r\nstarting\n")
        heartbeat.last = time.monotonic()
        get = exchange(probe.port, b"GET /healthz?verbose HTTP/1.1\r\n\r\n")
        assert get.startswith(b"HTTP/1.1 200 OK\r\n") and get.endswith(
            b"content-length: 3\r\nconnection: close\r\n\r\nok\n"
        )
        head = exchange(probe.port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
        for request in (b"GET /metrics HTTP/1.1\r\n\r\n", b"POST /healthz HTTP/1.1\r\n\r\n", b"\r\n\r\n"):
            assert exchange(probe.port, request).startswith(b"HTTP/1.1 404 Not Found\r\n"), request
        heartbeat.last = time.monotonic() - 31
        assert exchange(probe.port, KUBELET_REQUEST).startswith(b"HTTP/1.1 503 Service Unavailable\r\n")


def exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` and read the answer to the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        response = b""
        while chunk := sock.recv(4096):
            response += chunk
    return response


def test_the_liveness_listener_loads_no_uvicorn() -> None:
    """It must answer however uvicorn fares, so it shares no code with it.

    Shown failing on the listener before issue 22, which imported the guarded uvicorn protocol for its 404.
    """
    code = "import sys, modelkv_exporter.sidecar.http.liveness_port; print(sorted(m for m in sys.modules if 'uvicorn' in m))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]"
