"""uvicorn's httptools protocol with limits: no client can hold a connection, memory or the log for long.

uvicorn (0.29 to 0.55) bounds none of this: a head of any size is buffered until it ends, a connection
that sends nothing or trickles a header is kept forever, an unread body is read to its end,
and every bad request logs a warning. ``guarded_protocol`` returns a subclass of
``HttpToolsProtocol`` for ``uvicorn.Config(http=...)`` that keeps everything else of uvicorn
(scopes, ASGI cycles, pipelining, flow control) and adds, before any ASGI code runs:

- a request target over ``max_line_bytes``: 414; a header line over it, more than
  ``max_headers`` headers, or a head over ``max_header_bytes`` (counted before the parser sees
  the bytes, so nothing buffers more): 431;
- a head not complete ``header_timeout`` seconds after its first byte, however slowly it comes: 408;
- no request ``idle_timeout`` seconds after the connection was made or its last response: closed;
- a declared body over ``max_body_bytes``: 413; an unread body is dropped up to that size after
  the response, and beyond it the connection is closed;
- ``max_connections`` open: a new connection closes the one idle longest, or, if none is idle,
  is closed at once, unread and unanswered (an answer would mean reading its request: the work
  the cap is there to refuse; a 503 would also count against the server as an error);
- a response the client has not taken ``send_timeout`` seconds after it was written: aborted;
- responses not yet taken holding more than ``max_unsent_bytes`` in all (slow readers each
  pinning another version of a large body): the connection holding the most is aborted.

Error answers are followed by a half-close and a short, bounded read of what the client still
sends, so it reads the status rather than a reset. Each refusal is counted by ``Refusal``.
"""

# What of uvicorn this rests on. Its public settings carry what they can: the class goes in through
# ``Config(http=...)``, and server.py sets ``server_header``, ``backlog`` and ``ws`` there too.
# For the rest uvicorn has no public setting: ``limit_concurrency`` answers 503 only after reading a
# request's head (the work a connection cap is there to refuse) and closes no idle connection to make
# room; ``h11_max_incomplete_event_size`` bounds the h11 parser only, and uvicorn has no head, header
# count, header time or body limit for httptools, nor any send timeout. So this subclasses uvicorn's
# ``HttpToolsProtocol``, whose methods and attributes are not documented API. Left, and why:
# - asyncio's protocol methods (``connection_made``, ``connection_lost``, ``data_received``,
#   ``pause_writing``, ``resume_writing``) and httptools' parser callbacks (``on_message_begin``,
#   ``on_url``, ``on_header``, ``on_headers_complete``, ``on_body``, ``on_message_complete``): public
#   names of asyncio and httptools; overridden to count and time the bytes and the head before uvicorn
#   sees them, each calling uvicorn's own through ``super()``.
# - ``on_response_complete``: uvicorn's callback when a response is written, the one moment a
#   connection becomes idle again.
# - ``send_400_response``: what uvicorn calls on a parser error, which is how a callback's refusal
#   (``_Refused``) reaches the client; overridden to answer the refusal's status instead of 400.
# - ``_unset_keepalive_if_required`` (private): cancels the keep-alive timer uvicorn arms after each
#   response. The public ``timeout_keep_alive`` (server.py sets it) starts no timer before a first
#   request, keeps no idle order for the cap to evict by, and ends with a plain close that waits on
#   unsent bytes; this module's idle timer takes its place, as it does before a first request.
# - attributes read: ``transport`` (set here too for a refused connection), ``scope`` (to add the abort
#   extension), ``cycle`` with its ``response_started``, ``response_complete``, ``disconnected`` and
#   ``message_event`` (to drop the app's answer when a refusal comes first), ``pipeline`` (pipelined
#   requests waiting); ``parser`` is cleared for a refused connection, as uvicorn clears it.
# Every one of these names, methods and instance attributes (the cycle's too), is checked when a server is
# built (``uvicorn_surface.check_uvicorn_surface``); pyproject.toml caps uvicorn at the newest version whose
# tests pass, and `make test` runs them on the lowest one too.

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, MutableMapping
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from modelkv_exporter.sidecar.http.limits import LINGER_SECONDS, HttpLimits
from modelkv_exporter.sidecar.http.raw_responses import closing_response
from modelkv_exporter.sidecar.http.sending import ABORT
from modelkv_exporter.sidecar.http.uvicorn_surface import check_uvicorn_surface
from modelkv_exporter.sidecar.label_values import Refusal

STATUS_REFUSAL = {
    400: Refusal.INVALID_REQUEST,
    408: Refusal.HEADER_TIMEOUT,
    413: Refusal.BODY,
    414: Refusal.REQUEST_LINE,
    431: Refusal.HEADERS,
}


ANSWERS = {status: closing_response(status) for status in STATUS_REFUSAL}


class _Refused(Exception):
    """Raised in a parser callback; httptools passes it to uvicorn as a parser error."""


class GuardedProtocol(HttpToolsProtocol):
    """One connection, held to ``limits``. ``guarded_protocol`` binds the class attributes per server."""

    limits: ClassVar[HttpLimits] = HttpLimits()
    refusals: ClassVar[MutableMapping[str, int]] = collections.Counter()
    idle: ClassVar[collections.OrderedDict[GuardedProtocol, None]] = collections.OrderedDict()
    """Connections waiting for a request, longest-waiting first."""
    accepted: ClassVar[set[GuardedProtocol]] = set()
    """The server's open connections (kept here rather than read from uvicorn's server state)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._served = False
        self._in_head = True
        self._head_started = False
        self._head_bytes = 0
        self._headers_seen = 0
        self._line_bytes = 0
        self._content_length = 0
        self._chunked = False
        self._status = 0
        self._body_declared: int | None = 0
        self._body_seen = 0
        self._discarded = 0
        self._send_grace = False
        self._lingering = -1

    def _count(self, refusal: Refusal) -> None:
        self.refusals[refusal.value] = self.refusals.get(refusal.value, 0) + 1

    # Connections -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Accept within ``max_connections``, closing the longest-idle connection to make room, else refuse."""
        if len(self.accepted) >= self.limits.max_connections and not self._evict_idle():
            self._refused = True
            self.transport = transport
            self._count(Refusal.CONNECTIONS)
            transport.close()
            return
        super().connection_made(transport)
        self.accepted.add(self)
        self._wait_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection's timers and place in the idle order."""
        self._cancel_timer()
        self._resume_sending()
        self.idle.pop(self, None)
        if self._refused:
            self.parser = None  # type: ignore[assignment]  # no parser <-> protocol cycle left for the collector
            return
        self.accepted.discard(self)
        super().connection_lost(exc)

    def _evict_idle(self) -> bool:
        while self.idle:
            victim, _ = self.idle.popitem(last=False)
            if not victim.transport.is_closing():
                self._count(Refusal.EVICTED)
                victim._cancel_timer()
                victim.transport.close()
                return True
        return False

    # Timers ----------------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._cancel_timer()
        self._timer = self._loop.call_later(delay, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wait_idle(self) -> None:
        """Between requests: the connection is closed if no request starts within ``idle_timeout``."""
        self._in_head, self._head_started, self._head_bytes = True, False, 0
        self._send_grace = False
        self._arm(self.limits.idle_timeout, self._idle_expired)
        self.idle.pop(self, None)
        self.idle[self] = None

    def _idle_expired(self) -> None:
        self._timer = None
        if self.transport.get_write_buffer_size() > 0 and not self._send_grace:
            self._send_grace = True
            delay = max(0.0, self.limits.send_timeout - self.limits.idle_timeout)
            self._arm(delay, self._idle_expired)
            return
        self.idle.pop(self, None)
        if not self._served:
            self._count(Refusal.SILENT)
        self._shut()

    def _head_expired(self) -> None:
        self._timer = None
        self._count(Refusal.HEADER_TIMEOUT)
        self.idle.pop(self, None)
        if self.transport.get_write_buffer_size() > 0:
            self._shut()
        elif not self.transport.is_closing():
            self.transport.write(ANSWERS[408])
            self.transport.close()

    def _shut(self) -> None:
        """Close; abort when response bytes are still unsent (a close would wait for the client to read them)."""
        self._timer = None
        if self.transport.get_write_buffer_size() > 0:
            self._count(Refusal.SEND_TIMEOUT)
            self.transport.abort()
        elif not self.transport.is_closing():
            self.transport.close()

    # Bytes in --------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        """Feed the parser, never more head than ``max_header_bytes``; drop bytes after an error answer."""
        if self._refused or (self.transport.is_closing() and self._lingering < 0):
            return
        if self._lingering >= 0:
            self._lingering -= len(data)
            if self._lingering < 0:
                self._shut()
            return
        if not self._in_head:
            super().data_received(data)
            return
        room = self.limits.max_header_bytes - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            super().data_received(data)
            return
        self._head_bytes += room
        super().data_received(data[:room])
        if self.transport.is_closing() or self._lingering >= 0:
            return
        if self._in_head:
            self._refuse(431)
            return
        super().data_received(data[room:])

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error, ours included: the status a callback chose, else 400."""
        self._refuse(self._status or 400)

    def _refuse(self, status: int) -> None:
        self._count(STATUS_REFUSAL[status])
        self._cancel_timer()
        self.idle.pop(self, None)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's answer, if it comes, is dropped
            cycle.message_event.set()
            if cycle.response_started:
                self._shut()
                return
        self.transport.write(ANSWERS[status])
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._lingering = self.limits.max_body_bytes
        self._arm(LINGER_SECONDS, self._shut)

    def _reject(self, status: int) -> None:
        self._status = status
        raise _Refused(status)

    # Parser callbacks ------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        """A request starts: its head must be complete within ``header_timeout``."""
        self.idle.pop(self, None)
        if not self._head_started:
            self._head_started = True
            self._arm(self.limits.header_timeout, self._head_expired)
        self._in_head = True
        self._headers_seen = 0
        self._line_bytes = 0
        self._content_length = 0
        self._chunked = False
        self._body_seen = 0
        self._discarded = 0
        super().on_message_begin()
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
        extensions[ABORT] = self.transport.abort

    def on_url(self, url: bytes) -> None:
        """414 past ``max_line_bytes``."""
        self._line_bytes += len(url)
        if self._line_bytes > self.limits.max_line_bytes:
            self._reject(414)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """431 past ``max_headers`` or a header line past ``max_line_bytes``; notes how the body is framed."""
        self._headers_seen += 1
        if self._headers_seen > self.limits.max_headers or len(name) + len(value) > self.limits.max_line_bytes:
            self._reject(431)
        lowered = name.lower()
        if lowered == b"content-length":
            self._content_length = int(value)
        elif lowered == b"transfer-encoding":
            self._chunked = True
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        """The head is in: 413 for a declared body past ``max_body_bytes``, else on to the app."""
        self._in_head = False
        self._cancel_timer()
        declared = None if self._chunked else self._content_length
        self._body_declared = declared
        if declared is not None and declared > self.limits.max_body_bytes:
            self._reject(413)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        """Drop a body the app answered without; 413 for a chunked body past ``max_body_bytes``."""
        self._body_seen += len(body)
        if self.cycle is not None and self.cycle.response_complete:
            self._discarded += len(body)
            if self._discarded > self.limits.max_body_bytes and not self.transport.is_closing():
                self._count(Refusal.BODY_NOT_READ)
                self._cancel_timer()
                self.transport.close()
            return
        if self._body_seen > self.limits.max_body_bytes:
            self._reject(413)
        super().on_body(body)

    def on_message_complete(self) -> None:
        """A request's last byte: if its response is out too, the connection waits for the next."""
        super().on_message_complete()
        self._in_head, self._head_started, self._head_bytes = True, False, 0
        if self.cycle is not None and self.cycle.response_complete and not self.pipeline:
            if not self.transport.is_closing():
                self._wait_idle()

    # Bytes out -------------------------------------------------------------------------------

    def pause_writing(self) -> None:
        """The client stopped taking bytes: it has ``send_timeout`` seconds to take them again, and all
        connections together may hold ``max_unsent_bytes``."""
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self._loop.call_later(self.limits.send_timeout, self._send_expired)
        self._check_unsent()

    def _check_unsent(self) -> None:
        unsent = {c: c.transport.get_write_buffer_size() for c in self.accepted if not c.transport.is_closing()}
        total = sum(unsent.values())
        while total > self.limits.max_unsent_bytes and unsent:
            heaviest = max(unsent, key=unsent.__getitem__)
            total -= unsent.pop(heaviest)
            heaviest._count(Refusal.UNSENT)
            heaviest._cancel_timer()
            heaviest.idle.pop(heaviest, None)
            heaviest.transport.abort()

    def resume_writing(self) -> None:
        """The client takes bytes again."""
        super().resume_writing()
        self._resume_sending()

    def _resume_sending(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_expired(self) -> None:
        self._send_timer = None
        self._count(Refusal.SEND_TIMEOUT)
        self._cancel_timer()
        self.idle.pop(self, None)
        self.transport.abort()

    def on_response_complete(self) -> None:
        """A response is written: wait for the next request, or drop the rest of an unread body."""
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        self._unset_keepalive_if_required()
        self._served = True
        if self.transport.get_write_buffer_size() > 0:
            self._check_unsent()
        if self.transport.is_closing() or pipelined:
            return
        if not self._in_head:
            declared = self._body_declared
            rest = None if declared is None else declared - self._body_seen
            if rest is None or rest > self.limits.max_body_bytes:
                self._count(Refusal.BODY_NOT_READ)
                self._cancel_timer()
                self.transport.close()
                return
            self._arm(self.limits.idle_timeout, self._shut)
        elif not self._head_started:
            self._wait_idle()


def guarded_protocol(limits: HttpLimits, refusals: MutableMapping[str, int]) -> type[GuardedProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)``: one server's ``limits``, counting into ``refusals``."""
    check_uvicorn_surface()
    return type(
        "GuardedProtocol",
        (GuardedProtocol,),
        {"limits": limits, "refusals": refusals, "idle": collections.OrderedDict(), "accepted": set()},
    )
