"""The liveness port: ``GET /healthz`` answered from its own thread and socket, never behind the event loop.

uvloop accepts about one connection per loop turn, so under a flood of connections on the main
port (``wrk -c4000``) a probe waits seconds in the accept queue, and the kubelet would restart
a sidecar that is working. This listener has its own accept queue and answers from a thread,
so it keeps answering in milliseconds. What it reports is still the event loop's health: 200
while the loop has run its heartbeat (uvicorn's ``callback_notify``, once a second) within
``max_stall`` seconds, else 503. Before the first heartbeat, which uvicorn's main loop runs once
the app has started and the main port listens, it answers 503 ``starting``: a startup probe
passes only once the server serves.

It serves one short connection at a time (the kubelet's), reads at most ``MAX_REQUEST_BYTES``
with a one-second timeout, and closes; it is meant for the kubelet only (see docs/deploy.md).
"""

from __future__ import annotations

import math
import socket
import threading
import time

from modelkv_exporter.sidecar.http.guard import canned

MAX_STALL_SECONDS = 30.0
MAX_REQUEST_BYTES = 4096
READ_TIMEOUT_SECONDS = 1.0
ACCEPT_POLL_SECONDS = 0.5

_OK = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n"
)
_STALLED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 19\r\n"
    b"connection: close\r\n\r\nevent loop stalled\n"
)
_STARTING = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 9\r\n"
    b"connection: close\r\n\r\nstarting\n"
)
_NOT_FOUND = canned(404)


class Heartbeat:
    """When the event loop last ran a callback; ``beat`` is uvicorn's ``callback_notify``."""

    def __init__(self) -> None:
        self.last: float | None = None
        """None until the first beat: the server has not started serving yet."""

    async def beat(self) -> None:
        """Called on the event loop, once a second while it turns."""
        self.last = time.monotonic()

    def age(self) -> float:
        """Seconds since the last beat (infinite before the first)."""
        return math.inf if self.last is None else time.monotonic() - self.last


def answer(request: bytes, heartbeat: Heartbeat, max_stall: float) -> bytes:
    """The whole response to the bytes of one request head."""
    parts = request.split(b" ", 2)
    method, target = (parts[0], parts[1]) if len(parts) == 3 else (b"", b"")
    if method not in (b"GET", b"HEAD") or target.partition(b"?")[0] != b"/healthz":
        return _NOT_FOUND
    if heartbeat.last is None:
        response = _STARTING
    else:
        response = _OK if heartbeat.age() <= max_stall else _STALLED
    return response if method == b"GET" else response[: response.index(b"\r\n\r\n") + 4]


class ProbeListener:
    """A listening socket and the daemon thread that serves it; ``start`` binds, ``stop`` closes and joins."""

    def __init__(self, host: str, port: int, heartbeat: Heartbeat, max_stall: float = MAX_STALL_SECONDS) -> None:
        self.host = host
        self.port = port
        self.heartbeat = heartbeat
        self.max_stall = max_stall
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Bind and listen (an error here stops the server's start), then serve from a thread."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.host, self.port))
            listener.listen(64)
        except OSError:
            listener.close()
            raise
        listener.settimeout(ACCEPT_POLL_SECONDS)
        self.port = listener.getsockname()[1]
        self._socket = listener
        self._thread = threading.Thread(target=self._serve, name="modelkv-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._socket is not None:
            self._socket.close()

    def _serve(self) -> None:
        assert self._socket is not None
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with connection:
                try:
                    connection.settimeout(READ_TIMEOUT_SECONDS)
                    request = b""
                    while b"\r\n\r\n" not in request and len(request) < MAX_REQUEST_BYTES:
                        chunk = connection.recv(MAX_REQUEST_BYTES)
                        if not chunk:
                            break
                        request += chunk
                    connection.sendall(answer(request, self.heartbeat, self.max_stall))
                except OSError:
                    pass
