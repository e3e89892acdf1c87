"""The sidecar's one router. Read-only: every route answers GET and HEAD, and nothing else.

Whatever reads the spool or renders from it runs on the app's worker thread (``in_worker``);
the event loop only parses, routes and sends. Every response says ``nosniff``; none carries a
path of the sidecar's file system or an OS error (the log has those).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.exposition.negotiation import GZIP, choose_encoding, wants_openmetrics
from modelkv_exporter.sidecar.http.pages import Pages
from modelkv_exporter.sidecar.http.sending import send_body
from modelkv_exporter.sidecar.presentation.page import CONTENT_SECURITY_POLICY
from modelkv_exporter.sidecar.presentation.safe_text import SPOOL_UNREADABLE
from modelkv_exporter.sidecar.source import SpoolSource

READ = ["GET", "HEAD"]
NOSNIFF = {"X-Content-Type-Options": "nosniff"}
NOT_ACCEPTABLE = b"no acceptable content coding: this server sends identity or gzip\n"
router = APIRouter()
T = TypeVar("T")


class BytesResponse(Response):
    """A cached body, sent by ``send_body`` (in pieces, held within the app's ``HeldBodies``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send_body(scope, send, (bytes(self.body),), getattr(scope["app"].state, "held", None))


async def in_worker(app: Any, work: Callable[[], T]) -> T:
    """``work()`` on the app's spool worker thread, awaited without blocking the event loop."""
    return await asyncio.get_running_loop().run_in_executor(app.state.worker, work)


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
        encoding = choose_encoding(accept_encoding)
        if encoding is None:
            headers = [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", b"%d" % len(NOT_ACCEPTABLE)),
            ]
            await send({"type": "http.response.start", "status": 406, "headers": headers})
            await send({"type": "http.response.body", "body": NOT_ACCEPTABLE})
            return
        exposition: ExpositionCache = scope["app"].state.exposition
        openmetrics = wants_openmetrics(accept)
        body = await in_worker(
            scope["app"], lambda: exposition.render(openmetrics=openmetrics, compress=encoding == GZIP)
        )
        headers = [
            (b"content-type", body.content_type.encode()),
            (b"vary", b"Accept, Accept-Encoding"),
            (b"content-length", str(len(body)).encode()),
            (b"x-content-type-options", b"nosniff"),
        ]
        if body.gzipped:
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send_body(scope, send, body.parts, getattr(scope["app"].state, "held", None))


router.routes.append(Route("/metrics", MetricsEndpoint(), methods=READ, include_in_schema=False))


@router.api_route("/healthz", methods=READ, include_in_schema=False)
async def healthz() -> PlainTextResponse:
    """Liveness: the event loop answers (``--probe-port`` answers the same from its own thread)."""
    return PlainTextResponse("ok\n", headers=NOSNIFF)


@router.api_route("/readyz", methods=READ, include_in_schema=False)
async def readyz(request: Request) -> PlainTextResponse:
    """Readiness: the spool directory can be listed (the scan behind modelkv_exporter_spool_scan_success)."""
    source: SpoolSource = request.app.state.source
    scan = await in_worker(request.app, source.reader.scan)
    if scan.ok:
        return PlainTextResponse("ok\n", headers=NOSNIFF)
    return PlainTextResponse(f"spool not readable: {SPOOL_UNREADABLE}\n", status_code=503, headers=NOSNIFF)


@router.api_route("/api/v1/engines", methods=READ, include_in_schema=False)
async def engines(request: Request) -> BytesResponse:
    """Every snapshot in the spool as JSON, with its state, and the rejected files."""
    pages: Pages = request.app.state.pages
    body = await in_worker(request.app, pages.engines)
    return BytesResponse(body, media_type="application/json", headers=NOSNIFF)


@router.api_route("/", methods=READ, include_in_schema=False)
async def landing(request: Request) -> BytesResponse:
    """A self-contained HTML page: engines, their declarations, rejected files, links."""
    pages: Pages = request.app.state.pages
    body = await in_worker(request.app, pages.landing)
    headers = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, **NOSNIFF}
    return BytesResponse(body, media_type="text/html; charset=utf-8", headers=headers)
