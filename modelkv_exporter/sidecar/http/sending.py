"""Sending cached bodies: in small pieces, and with the bodies held for unfinished responses bounded.

A response holds its body until the client has taken the last byte. Bodies are cached and
shared, but every spool change makes new ones, so clients that ask and then never read can
each hold another version of a large body (256 of them, a 6 MB /metrics each, over the 30 s
a slow client is given). ``HeldBodies`` keeps the distinct bodies held by unfinished responses
within ``max_bytes``: past it, the responses that started longest ago are aborted (their
connections cut, counted as ``unsent_bytes``) until the rest fit.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field

from starlette.types import Scope, Send

from modelkv_exporter.sidecar.label_values import Refusal

SEND_CHUNK_BYTES = 256 * 1024
"""Bodies go to the connection in views of at most this size, each once the client took the last."""

ABORT = "modelkv.abort"
"""The scope extension (set by the guarded protocol) that cuts the request's connection."""


@dataclass
class _Holder:
    parts: tuple[bytes, ...]
    abort: Callable[[], None] | None
    cut: bool = False


@dataclass
class HeldBodies:
    """The distinct bodies unfinished responses hold, within ``max_bytes``. Used on the event loop only."""

    max_bytes: int
    refusals: MutableMapping[str, int]
    _holders: dict[int, _Holder] = field(default_factory=dict)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def held_bytes(self, *, counting_cut: bool = True) -> int:
        """Bytes of the distinct bodies held (by responses not yet cut, unless ``counting_cut``)."""
        parts = {id(p): len(p) for h in self._holders.values() if counting_cut or not h.cut for p in h.parts}
        return sum(parts.values())

    def hold(self, parts: tuple[bytes, ...], abort: Callable[[], None] | None) -> int:
        """Register a response about to send ``parts``; cut the oldest others while the total is over."""
        ticket = next(self._order)
        self._holders[ticket] = _Holder(parts, abort)
        for older, holder in list(self._holders.items()):
            if self.held_bytes(counting_cut=False) <= self.max_bytes:
                break
            if older == ticket or holder.cut or holder.abort is None:
                continue
            holder.cut = True
            self.refusals[Refusal.UNSENT.value] = self.refusals.get(Refusal.UNSENT.value, 0) + 1
            holder.abort()
        return ticket

    def release(self, ticket: int) -> None:
        """The response is finished (sent, or its connection gone)."""
        self._holders.pop(ticket, None)


async def send_body(scope: Scope, send: Send, parts: tuple[bytes, ...], held: HeldBodies | None) -> None:
    """Send ``parts`` as one body, in views of at most ``SEND_CHUNK_BYTES`` (no copies), waiting on flow control."""
    ticket = None if held is None else held.hold(parts, scope.get("extensions", {}).get(ABORT))
    try:
        pieces = [
            memoryview(part)[i : i + SEND_CHUNK_BYTES] for part in parts for i in range(0, len(part), SEND_CHUNK_BYTES)
        ]
        last = len(pieces) - 1
        for i, piece in enumerate(pieces):
            await send({"type": "http.response.body", "body": piece, "more_body": i < last})
        if not pieces:
            await send({"type": "http.response.body", "body": b""})
    finally:
        if held is not None and ticket is not None:
            held.release(ticket)
