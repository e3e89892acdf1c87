"""The sidecar's HTTP face over one spool: /metrics and /healthz answered directly, the rest by FastAPI. Read-only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from modelkv_exporter.collector import DEFAULT_STALE_AFTER_SECONDS, SpoolCollector
from modelkv_exporter.exposition import accepts_gzip, wants_openmetrics
from modelkv_exporter.render_cache import ExpositionCache
from modelkv_exporter.spool import DEFAULT_MAX_SNAPSHOT_BYTES, SpoolReader


@dataclass(frozen=True)
class SidecarConfig:
    """What the sidecar app needs to know."""

    spool_dir: Path
    stale_after: float = DEFAULT_STALE_AFTER_SECONDS
    max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class SidecarApp:
    """The ASGI app uvicorn serves.

    ``GET /metrics`` is answered straight from the exposition cache and ``GET /healthz`` with
    ``ok``: a scrape of an unchanged spool costs a directory stat and the send of cached bytes,
    less than FastAPI's routing alone. Every other request goes to the FastAPI app of
    ``modelkv_exporter.api``, imported and built on the first such request, so a sidecar that
    is only scraped and probed never loads FastAPI and pydantic. Other methods on /metrics and
    /healthz also go there, and it answers 405.
    """

    def __init__(self, collector: SpoolCollector, exposition: ExpositionCache) -> None:
        self.collector = collector
        self.exposition = exposition
        self.state = SimpleNamespace(reader=collector.reader)
        self._api: Any = None

    @property
    def api(self) -> Any:
        """The FastAPI app for every other route, built on first use."""
        if self._api is None:
            from modelkv_exporter.api import build_api

            self._api = build_api(self.collector)
        return self._api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/healthz":
            await _send(send, 200, [(b"content-type", b"text/plain; charset=utf-8")], (b"ok\n",))
            return
        if scope["type"] != "http" or scope["path"] != "/metrics" or scope["method"] != "GET":
            await self.api(scope, receive, send)
            return
        accept = accept_encoding = None
        for name, value in scope["headers"]:
            if name == b"accept":
                accept = value.decode("latin-1")
            elif name == b"accept-encoding":
                accept_encoding = value.decode("latin-1")
        body = self.exposition.render(openmetrics=wants_openmetrics(accept), compress=accepts_gzip(accept_encoding))
        headers = [(b"content-type", body.content_type.encode()), (b"vary", b"Accept, Accept-Encoding")]
        if body.gzipped:
            headers.append((b"content-encoding", b"gzip"))
        await _send(send, 200, headers, body.parts)

    @staticmethod
    async def _lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], parts: tuple[bytes, ...]) -> None:
    length = str(sum(map(len, parts))).encode()
    await send({"type": "http.response.start", "status": status, "headers": [*headers, (b"content-length", length)]})
    for i, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part, "more_body": i < len(parts) - 1})


def create_app(config: SidecarConfig) -> SidecarApp:
    """Build the sidecar app. Nothing is registered globally; each app has its own collector and cache.

    Handlers run on the event loop, not in a thread pool: a scrape of an unchanged spool costs a
    directory stat and the send of cached bytes, and no worker threads means no per-thread
    malloc arenas, so RSS stays flat under concurrent scrapes.
    """
    reader = SpoolReader(config.spool_dir, max_bytes=config.max_snapshot_bytes)
    collector = SpoolCollector(reader, stale_after=config.stale_after)
    return SidecarApp(collector, ExpositionCache(collector))
