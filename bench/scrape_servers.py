"""Peer servers for bench/scrape.py, each run as its own process: ``python bench/scrape_servers.py KIND PORT ARG``.

- ``ceiling``: uvicorn serving an already-rendered body (the file ARG) from a bare ASGI app.
- ``client_python``: prometheus_client's built-in HTTP server on a registry holding our
  SpoolCollector over the spool ARG (renders on every scrape).
- ``per_scrape``: the sidecar's design before render-once: FastAPI, the same collector,
  prometheus_client's encoder and gzip on every scrape.
"""

from __future__ import annotations

import gzip
import sys
import threading
from pathlib import Path

from fastapi import Request
from fastapi.responses import Response


def ceiling(port: int, body_file: str) -> None:
    import uvicorn

    body = Path(body_file).read_bytes()
    compressed = gzip.compress(body)

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        wants_gzip = any(k == b"accept-encoding" and b"gzip" in v for k, v in scope.get("headers", []))
        data = compressed if wants_gzip else body
        headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
        if wants_gzip:
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


ROOMY_BYTES = 64 * 1024 * 1024
"""The benchmark's largest snapshots pass the reader's default 256 KiB."""


def client_python(port: int, spool: str) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    from modelkv_exporter.sidecar.collector import SpoolCollector
    from modelkv_exporter.sidecar.reader.scan import SpoolReader
    from modelkv_exporter.sidecar.source import SpoolSource

    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        SpoolCollector(
            SpoolSource(SpoolReader(Path(spool), max_snapshot_bytes=ROOMY_BYTES, max_spool_bytes=ROOMY_BYTES))
        )
    )
    start_http_server(port, addr="127.0.0.1", registry=registry)
    threading.Event().wait()


def per_scrape(port: int, spool: str) -> None:
    import uvicorn
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    from modelkv_exporter.sidecar.collector import SpoolCollector
    from modelkv_exporter.sidecar.exposition.negotiation import accepts_gzip
    from modelkv_exporter.sidecar.reader.scan import SpoolReader
    from modelkv_exporter.sidecar.source import SpoolSource

    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        SpoolCollector(
            SpoolSource(SpoolReader(Path(spool), max_snapshot_bytes=ROOMY_BYTES, max_spool_bytes=ROOMY_BYTES))
        )
    )
    app = FastAPI()

    @app.get("/metrics")
    def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = encoder(registry)
        headers = {"Content-Type": content_type}
        if accepts_gzip(request.headers.get("accept-encoding")):
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        return Response(content=body, headers=headers)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    kind, port, argument = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    {"ceiling": ceiling, "client_python": client_python, "per_scrape": per_scrape}[kind](port, argument)
