"""``make_app``: the sidecar's ASGI app for one spool directory."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastapi import FastAPI

from modelkv_exporter.contract.version import VERSION
from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.http.pages import Pages
from modelkv_exporter.sidecar.http.routes import router
from modelkv_exporter.sidecar.http.sending import HeldBodies
from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig
from modelkv_exporter.sidecar.http.spool_watch import watch_spool
from modelkv_exporter.sidecar.source import SpoolSource


def _lifespan(directory: Path, interval: float) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """While the app serves: the spool watch; after, the spool worker thread ends."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        watcher = asyncio.create_task(watch_spool(directory, interval))
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            app.state.worker.shutdown(wait=False, cancel_futures=True)

    return lifespan


def make_app(config: SidecarConfig, source: SpoolSource | None = None) -> FastAPI:
    """The FastAPI app over ``config.spool_dir``. Nothing is global: each app has its own source and cache.

    ``source`` replaces the one built from ``config`` (a test's clock, say). Everything that reads
    the spool or renders from it runs on one worker thread (``app.state.worker``), one call at a
    time, never on the event loop: a slow scan or a large rendering cannot delay /healthz or
    another client's bytes. ``app.state.refusals`` counts what the server refused (exported).
    """
    source = source or SpoolSource.budgeted(
        config.spool_dir, budget=config.budget, reading=config.reading, staleness=config.staleness
    )
    app = FastAPI(
        title="modelkv-exporter",
        version=VERSION,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        redirect_slashes=False,
        lifespan=_lifespan(source.reader.directory, config.spool_check_interval),
    )
    app.state.source = source
    app.state.refusals = collections.Counter()
    app.state.exposition = ExpositionCache(source, refusals=app.state.refusals)
    app.state.pages = Pages(source, cli=config.cli, cli_spool=config.cli_spool, runbook_url=config.runbook_url)
    app.state.held = HeldBodies(config.http.max_unsent_bytes, app.state.refusals)
    app.state.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modelkv-spool")
    app.include_router(router)
    return app
