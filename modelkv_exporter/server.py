"""The sidecar's uvicorn server, built the same way for ``serve`` and the demo."""

from __future__ import annotations

import argparse
from pathlib import Path

import uvicorn

from modelkv_exporter.app import SidecarConfig, create_app


def sidecar_server(spool_dir: Path, args: argparse.Namespace) -> uvicorn.Server:
    """A server for ``spool_dir`` from the parsed settings (host, port, stale_after, ...)."""
    app = create_app(SidecarConfig(spool_dir, stale_after=args.stale_after, max_snapshot_bytes=args.max_snapshot_bytes))
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, access_log=False, server_header=False
    )
    return uvicorn.Server(config)
