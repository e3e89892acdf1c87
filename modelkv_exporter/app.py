"""The sidecar's HTTP face: a FastAPI app over one spool. Read-only: every route is GET."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from modelkv_exporter import __version__
from modelkv_exporter.collector import DEFAULT_STALE_AFTER_SECONDS, SpoolCollector, engine_state
from modelkv_exporter.exposition import accepts_gzip, wants_openmetrics
from modelkv_exporter.landing import CONTENT_SECURITY_POLICY, render_landing
from modelkv_exporter.render_cache import ExpositionCache
from modelkv_exporter.snapshot import SCHEMA_VERSION
from modelkv_exporter.spool import DEFAULT_MAX_SNAPSHOT_BYTES, SpoolReader


@dataclass(frozen=True)
class SidecarConfig:
    """What the sidecar app needs to know."""

    spool_dir: Path
    stale_after: float = DEFAULT_STALE_AFTER_SECONDS
    max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES


def engines_document(collector: SpoolCollector) -> dict[str, Any]:
    """The spool as JSON: every engine's snapshot with its state, and every rejected file."""
    scan = collector.reader.scan()
    now = collector.clock()
    engines = []
    rejected = []
    for entry in scan.entries:
        snapshot = entry.snapshot
        if snapshot is None:
            assert entry.error is not None
            rejected.append({"file": entry.file_name, "reason": entry.error.reason.value, "detail": entry.error.detail})
            continue
        state = engine_state(snapshot, now, collector.stale_after)
        engines.append({"file": entry.file_name, "state": state, "snapshot": snapshot.to_dict()})
    return {
        "spool_dir": str(collector.reader.directory),
        "spool_error": scan.error,
        "schema_version": SCHEMA_VERSION,
        "engines": engines,
        "rejected": rejected,
    }


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class SidecarApp:
    """The ASGI app uvicorn serves: ``GET /metrics`` answered straight from the exposition cache, the rest by FastAPI.

    A scrape of an unchanged spool then costs a directory stat and the send of cached bytes;
    FastAPI's routing and response classes would cost more than the rendering itself. Other
    methods on /metrics go to FastAPI, which answers 405.
    """

    def __init__(self, api: FastAPI, exposition: ExpositionCache) -> None:
        self.api = api
        self.exposition = exposition

    @property
    def state(self) -> Any:
        """The FastAPI app's state (the spool reader, for tests and tools)."""
        return self.api.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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
        headers = [
            (b"content-type", body.content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"vary", b"Accept, Accept-Encoding"),
        ]
        if body.gzipped:
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i, part in enumerate(body.parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < len(body.parts) - 1})


def create_app(config: SidecarConfig) -> SidecarApp:
    """Build the sidecar app. Nothing is registered globally; each app has its own collector and cache.

    Handlers run on the event loop, not in a thread pool: a scrape of an unchanged spool costs a
    directory listing and a join of cached bytes, and no worker threads means no per-thread
    malloc arenas, so RSS stays flat under concurrent scrapes.
    """
    reader = SpoolReader(config.spool_dir, max_bytes=config.max_snapshot_bytes)
    collector = SpoolCollector(reader, stale_after=config.stale_after)
    exposition = ExpositionCache(collector)

    app = FastAPI(
        title="modelkv-exporter",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        redirect_slashes=False,
    )
    app.state.reader = reader

    @app.get("/", response_class=HTMLResponse)
    async def landing() -> HTMLResponse:
        """A self-contained HTML page: engines, their declarations, rejected files, links."""
        page = render_landing(
            reader.scan(),
            now=collector.clock(),
            stale_after=collector.stale_after,
            spool_dir=str(reader.directory),
            version=__version__,
        )
        headers = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff"}
        return HTMLResponse(page, headers=headers)

    @app.get("/metrics", include_in_schema=True)
    async def metrics() -> Response:
        """Prometheus metrics; answered by ``SidecarApp`` before routing, declared here for 405s and the schema."""
        raise AssertionError("GET /metrics is served by SidecarApp")

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        """Liveness: the process answers."""
        return "ok\n"

    @app.get("/readyz", response_class=PlainTextResponse)
    async def readyz() -> PlainTextResponse:
        """Readiness: the spool directory can be listed (the scan behind modelkv_exporter_spool_scan_success)."""
        scan = reader.scan()
        if scan.ok:
            return PlainTextResponse("ok\n")
        return PlainTextResponse(f"spool not readable: {scan.error}\n", status_code=503)

    @app.get("/api/v1/engines")
    async def engines() -> JSONResponse:
        """Every snapshot in the spool as JSON, with its state, and the rejected files."""
        return JSONResponse(engines_document(collector))

    return SidecarApp(app, exposition)
