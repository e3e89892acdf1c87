"""``make_app``: the sidecar's ASGI app for one spool directory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI

from modelkv_exporter import __version__
from modelkv_exporter.contract.scan import DEFAULT_MAX_SNAPSHOT_BYTES, SpoolReader
from modelkv_exporter.contract.state import DEFAULT_FORGET_AFTER_SECONDS, DEFAULT_STALE_AFTER_SECONDS
from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.http.routes import router
from modelkv_exporter.sidecar.http.spool_watch import DEFAULT_CHECK_INTERVAL_SECONDS, watch_spool
from modelkv_exporter.sidecar.source import SpoolSource


@dataclass(frozen=True)
class SidecarConfig:
    """What the sidecar app needs to know."""

    spool_dir: Path
    stale_after: float = DEFAULT_STALE_AFTER_SECONDS
    max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES
    spool_check_interval: float = DEFAULT_CHECK_INTERVAL_SECONDS
    """Seconds between checks that the spool directory exists and can be listed (a warning while not)."""
    forget_after: float = DEFAULT_FORGET_AFTER_SECONDS
    """Seconds after its last heartbeat at which a stale or ended engine is forgotten (0: never)."""


def _lifespan(directory: Path, interval: float) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """While the app serves: the spool watch."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        watcher = asyncio.create_task(watch_spool(directory, interval))
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    return lifespan


def make_app(config: SidecarConfig, source: SpoolSource | None = None) -> FastAPI:
    """The FastAPI app over ``config.spool_dir``. Nothing is global: each app has its own source and cache.

    ``source`` replaces the one built from ``config`` (a test's clock, say). Handlers run on the
    event loop, not in a thread pool: a scrape of an unchanged spool costs a directory stat and
    the send of cached bytes.
    """
    source = source or SpoolSource(
        SpoolReader(config.spool_dir, max_bytes=config.max_snapshot_bytes),
        stale_after=config.stale_after,
        forget_after=config.forget_after,
    )
    app = FastAPI(
        title="modelkv-exporter",
        version=__version__,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        redirect_slashes=False,
        lifespan=_lifespan(source.reader.directory, config.spool_check_interval),
    )
    app.state.source = source
    app.state.exposition = ExpositionCache(source)
    app.include_router(router)
    return app
