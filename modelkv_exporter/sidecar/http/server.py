"""The uvicorn server that serves the sidecar app, built the same way for ``serve`` and the demo."""

from __future__ import annotations

import uvicorn

from modelkv_exporter.sidecar.http.app import SidecarConfig, make_app


def build_server(config: SidecarConfig, *, host: str, port: int, log_level: str) -> uvicorn.Server:
    """A uvicorn server for the app over ``config``."""
    uvicorn_config = uvicorn.Config(
        make_app(config), host=host, port=port, log_level=log_level, access_log=False, server_header=False
    )
    return uvicorn.Server(uvicorn_config)
