"""The sidecar's one router. Read-only: every route answers GET and HEAD, and nothing else."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from modelkv_exporter import __version__
from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.exposition.negotiation import accepts_gzip, wants_openmetrics
from modelkv_exporter.sidecar.http.engines_document import engines_document
from modelkv_exporter.sidecar.http.landing import CONTENT_SECURITY_POLICY, render_landing
from modelkv_exporter.sidecar.source import SpoolSource

READ = ["GET", "HEAD"]
router = APIRouter()


class MetricsEndpoint:
    """``GET /metrics``: the cached rendering in the negotiated form, sent in its cached pieces.

    A plain ASGI endpoint of the router (Starlette's ``Route`` runs it as it is): FastAPI's
    request wrapping and dependency solving would cost more than the rest of a scrape of an
    unchanged spool, and /metrics needs neither.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        accept = accept_encoding = None
        for name, value in scope["headers"]:
            if name == b"accept":
                accept = value.decode("latin-1")
            elif name == b"accept-encoding":
                accept_encoding = value.decode("latin-1")
        exposition: ExpositionCache = scope["app"].state.exposition
        body = exposition.render(openmetrics=wants_openmetrics(accept), compress=accepts_gzip(accept_encoding))
        headers = [
            (b"content-type", body.content_type.encode()),
            (b"vary", b"Accept, Accept-Encoding"),
            (b"content-length", str(len(body)).encode()),
        ]
        if body.gzipped:
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        last = len(body.parts) - 1
        for i, part in enumerate(body.parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < last})


router.routes.append(Route("/metrics", MetricsEndpoint(), methods=READ, include_in_schema=False))


@router.api_route("/healthz", methods=READ, include_in_schema=False)
async def healthz() -> PlainTextResponse:
    """Liveness: the process answers."""
    return PlainTextResponse("ok\n")


@router.api_route("/readyz", methods=READ, include_in_schema=False)
async def readyz(request: Request) -> PlainTextResponse:
    """Readiness: the spool directory can be listed (the scan behind modelkv_exporter_spool_scan_success)."""
    source: SpoolSource = request.app.state.source
    scan = source.reader.scan()
    if scan.ok:
        return PlainTextResponse("ok\n")
    return PlainTextResponse(f"spool not readable: {scan.error}\n", status_code=503)


@router.api_route("/api/v1/engines", methods=READ, include_in_schema=False)
async def engines(request: Request) -> JSONResponse:
    """Every snapshot in the spool as JSON, with its state, and the rejected files."""
    source: SpoolSource = request.app.state.source
    return JSONResponse(engines_document(source.view(), str(source.reader.directory)))


@router.api_route("/", methods=READ, include_in_schema=False)
async def landing(request: Request) -> HTMLResponse:
    """A self-contained HTML page: engines, their declarations, rejected files, links."""
    source: SpoolSource = request.app.state.source
    page = render_landing(source.view(), spool_dir=str(source.reader.directory), version=__version__)
    headers = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff"}
    return HTMLResponse(page, headers=headers)
