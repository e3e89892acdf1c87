"""The liveness port: ``GET /healthz`` answered from its own thread and socket, never behind the event loop.

uvloop accepts about one connection per loop turn, so under a flood of connections on the main
port (``wrk -c4000``) a probe waits seconds in the accept queue, and the kubelet would restart
a sidecar that is working. This listener has its own accept queue and answers from a thread,
so it keeps answering in milliseconds. What it reports is still the event loop's health: 200
while the loop has run its heartbeat (uvicorn's ``callback_notify``, once a second) within
``max_stall`` seconds, else 503. Before the first heartbeat, which uvicorn's main loop runs once
the app has started and the main port listens, it answers 503 ``starting``: a startup probe
passes only once the server serves.

No client on this port can keep a probe waiting. One thread serves every connection at once
through a selector, so a slow client holds only its own connection. Each connection has
``deadline`` seconds from its accept to send a head (at most ``MAX_REQUEST_BYTES``) and take
the answer, then it is closed, answered or not. At most ``max_connections`` are open: a new
one closes the oldest. It is meant for the kubelet only (see docs/deploy.md and
docs/reliability.md). Nothing here imports uvicorn: the answers are formatted here.
"""

from __future__ import annotations

import errno
import math
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from modelkv_exporter.sidecar.http.raw_responses import closing_response

MAX_STALL_SECONDS = 30.0
MAX_REQUEST_BYTES = 4096
DEADLINE_SECONDS = 2.0
MAX_CONNECTIONS = 64
BACKLOG = 128
POLL_SECONDS = 0.5
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


_OK = closing_response(200, "ok\n")
_STALLED = closing_response(503, "event loop stalled\n")
_STARTING = closing_response(503, "starting\n")
_NOT_FOUND = closing_response(404)


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


@dataclass
class _Connection:
    """One accepted connection: its deadline, the head so far, then what is left of its answer."""

    sock: socket.socket
    deadline: float
    received: bytearray = field(default_factory=bytearray)
    unsent: bytes | None = None


class ProbeListener:
    """A listening socket and the daemon thread that serves it; ``start`` binds, ``stop`` closes and joins."""

    def __init__(
        self,
        host: str,
        port: int,
        heartbeat: Heartbeat,
        max_stall: float = MAX_STALL_SECONDS,
        *,
        deadline: float = DEADLINE_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.host = host
        self.port = port
        self.heartbeat = heartbeat
        self.max_stall = max_stall
        self.deadline = deadline
        self.max_connections = max_connections
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._open: dict[socket.socket, _Connection] = {}
        """Open connections, oldest (and so soonest due) first."""

    def bind(self) -> None:
        """Bind and listen, once; ``OSError`` when the port is taken (``port`` is then the one bound)."""
        if self._socket is not None:
            return
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.host, self.port))
            listener.listen(BACKLOG)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self._socket = listener
        self._selector.register(listener, selectors.EVENT_READ)

    def start(self) -> None:
        """Bind unless bound already (an error here stops the server's start), then serve from a thread."""
        self.bind()
        self._thread = threading.Thread(target=self._serve, name="modelkv-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        else:
            self._selector.close()
        if self._socket is not None:
            self._socket.close()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(self._wait()):
                    if key.data is None:
                        self._accept()
                    elif key.data.sock in self._open:
                        self._step(key.data)
                self._expire()
        finally:
            for connection in list(self._open.values()):
                self._close(connection)
            self._selector.close()

    def _wait(self) -> float:
        """Seconds until the oldest connection is due, at most ``POLL_SECONDS`` (how soon ``stop`` is seen)."""
        oldest = next(iter(self._open.values()), None)
        due = POLL_SECONDS if oldest is None else oldest.deadline - time.monotonic()
        return min(max(due, 0.0), POLL_SECONDS)

    def _accept(self) -> None:
        """Take what waits in the accept queue (a batch at most); past the cap, each new connection closes the oldest.

        A connection that fails on its way in (``ECONNABORTED``, the network errors Linux passes on
        to ``accept``) is skipped. Out of descriptors, the oldest is closed to make room.
        """
        assert self._socket is not None
        for _ in range(self.max_connections):
            try:
                sock, _ = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno not in OUT_OF_DESCRIPTORS:
                    continue
                if not self._evict_oldest():
                    self._stop.wait(POLL_SECONDS)
                return
            if len(self._open) >= self.max_connections:
                self._evict_oldest()
            sock.setblocking(False)
            connection = _Connection(sock, time.monotonic() + self.deadline)
            self._open[sock] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _step(self, connection: _Connection) -> None:
        """Read what the connection sent, or send what it has not taken of its answer."""
        if connection.unsent is None:
            try:
                chunk = connection.sock.recv(MAX_REQUEST_BYTES - len(connection.received))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(connection)
                return
            start = max(len(connection.received) - 3, 0)
            connection.received += chunk
            complete = connection.received.find(b"\r\n\r\n", start) >= 0
            if chunk and not complete and len(connection.received) < MAX_REQUEST_BYTES:
                return
            connection.unsent = answer(bytes(connection.received), self.heartbeat, self.max_stall)
        try:
            sent = connection.sock.send(connection.unsent)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(connection)
            return
        connection.unsent = connection.unsent[sent:]
        if connection.unsent:
            self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        else:
            self._close(connection)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._open:
            oldest = next(iter(self._open.values()))
            if oldest.deadline > now:
                return
            self._close(oldest)

    def _evict_oldest(self) -> bool:
        """Close the oldest connection, answering it first if its head has come (it may be a probe)."""
        oldest = next(iter(self._open.values()), None)
        if oldest is None:
            return False
        self._step(oldest)
        self._close(oldest)
        return True

    def _close(self, connection: _Connection) -> None:
        if self._open.pop(connection.sock, None) is not None:
            self._selector.unregister(connection.sock)
            connection.sock.close()
