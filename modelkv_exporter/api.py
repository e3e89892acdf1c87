"""The sidecar's routes for people and tools: the landing page, the JSON API, probes. Read-only: every route is GET.

Imported on the first request that needs it (``SidecarApp``): a sidecar that is only scraped
and probed never loads FastAPI and pydantic, which are most of its memory.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from modelkv_exporter import __version__
from modelkv_exporter.collector import SpoolCollector, engine_state
from modelkv_exporter.landing import CONTENT_SECURITY_POLICY, render_landing
from modelkv_exporter.snapshot import SCHEMA_VERSION


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


def build_api(collector: SpoolCollector) -> FastAPI:
    """The FastAPI app of every route; /metrics and /healthz are declared for 405s and the schema."""
    reader = collector.reader
    app = FastAPI(
        title="modelkv-exporter",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        redirect_slashes=False,
    )

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
        """Liveness: the process answers (``SidecarApp`` answers GET before routing)."""
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

    return app
