"""``make_app``: the sidecar's ASGI app for one spool directory."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from modelkv_exporter.contract.scan import DEFAULT_MAX_SNAPSHOT_BYTES, DEFAULT_MAX_SPOOL_BYTES, DEFAULT_MAX_SPOOL_FILES
from modelkv_exporter.contract.state import DEFAULT_FORGET_AFTER_SECONDS, DEFAULT_STALE_AFTER_SECONDS
from modelkv_exporter.contract.version import VERSION
from modelkv_exporter.sidecar.budget import Budget
from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.http.limits import HttpLimits
from modelkv_exporter.sidecar.http.pages import Pages
from modelkv_exporter.sidecar.http.routes import router
from modelkv_exporter.sidecar.http.sending import HeldBodies
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
    max_spool_files: int = DEFAULT_MAX_SPOOL_FILES
    max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES
    budget: Budget = field(default_factory=Budget)
    http: HttpLimits = field(default_factory=HttpLimits)
    probe_port: int = 0
    """The liveness listener's port; 0 for none (``serve`` listens on 9401 by default)."""


def sidecar_config(settings: Any, spool_dir: Path | None = None) -> SidecarConfig:
    """The config from the parsed settings of ``serve`` or ``demo`` (attributes named as in the settings table);
    ``spool_dir`` replaces ``settings.spool_dir``."""
    return SidecarConfig(
        spool_dir or Path(settings.spool_dir),
        stale_after=settings.stale_after,
        max_snapshot_bytes=settings.max_snapshot_bytes,
        forget_after=settings.forget_after,
        max_spool_files=settings.max_spool_files,
        max_spool_bytes=settings.max_spool_bytes,
        budget=Budget(
            settings.max_declarations, settings.max_label_bytes, settings.max_series, settings.max_scrape_label_bytes
        ),
        http=HttpLimits(
            max_connections=settings.http_max_connections,
            max_line_bytes=settings.http_max_line_bytes,
            max_header_bytes=settings.http_max_header_bytes,
            max_headers=settings.http_max_headers,
            max_body_bytes=settings.http_max_body_bytes,
            header_timeout=settings.http_header_timeout,
            idle_timeout=settings.http_idle_timeout,
            send_timeout=settings.http_send_timeout,
            max_unsent_bytes=settings.http_max_unsent_bytes,
        ),
        probe_port=settings.probe_port,
    )


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
        config.spool_dir,
        budget=config.budget,
        max_bytes=config.max_snapshot_bytes,
        max_files=config.max_spool_files,
        max_spool_bytes=config.max_spool_bytes,
        stale_after=config.stale_after,
        forget_after=config.forget_after,
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
    app.state.pages = Pages(source)
    app.state.held = HeldBodies(config.http.max_unsent_bytes, app.state.refusals)
    app.state.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modelkv-spool")
    app.include_router(router)
    return app
