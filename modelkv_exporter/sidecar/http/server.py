"""The uvicorn server that serves the sidecar app, built the same way for ``serve`` and the demo.

uvicorn with uvloop and httptools, its protocol held to ``config.http`` (``guard``), uvicorn's
own log lines rate-limited like the sidecar's and written by the same handlers in the same format
(uvicorn configures no logging of its own), and the liveness listener (``liveness_port``) started and
stopped with the server, its port logged.
"""

from __future__ import annotations

import gc
import logging
import socket
from collections.abc import Sequence

import uvicorn

from modelkv_exporter.sidecar.http.app import make_app
from modelkv_exporter.sidecar.http.guard import guarded_protocol
from modelkv_exporter.sidecar.http.liveness_port import Heartbeat, ProbeListener
from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig
from modelkv_exporter.sidecar.sidecar_log import get_logger, limit

HEARTBEAT_SECONDS = 1
BACKLOG = 2048
logger = get_logger("server")


class SidecarServer(uvicorn.Server):
    """A uvicorn server that runs the liveness listener while it serves."""

    def __init__(self, config: uvicorn.Config, probe: ProbeListener | None) -> None:
        super().__init__(config)
        self.probe = probe

    async def serve(self, sockets: Sequence[socket.socket] | None = None) -> None:
        """Serve, with the probe listener bound first (a taken probe port stops the start).

        Everything loaded so far (FastAPI, pydantic, uvicorn: some 50 000 objects) is moved out of the
        garbage collector's reach first: a full collection then costs milliseconds, not the 100 ms and
        more that held every thread, the probe listener's included, under a flood of connections.
        """
        gc.collect()
        gc.freeze()
        if self.probe is not None:
            self.probe.start()
            logger.info("liveness probes: GET /healthz on %s:%d (--probe-port)", self.probe.host, self.probe.port)
        else:
            logger.debug("no liveness listener (--probe-port 0); /healthz answers on the HTTP port")
        try:
            await super().serve(list(sockets) if sockets is not None else None)
        finally:
            if self.probe is not None:
                self.probe.stop()


def build_server(config: SidecarConfig, *, host: str, port: int, log_level: str) -> SidecarServer:
    """A server for the app over ``config``; ``config.probe_port`` 0 runs no probe listener."""
    app = make_app(config)
    heartbeat = Heartbeat()
    uvicorn_config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=None,
        access_log=False,
        server_header=False,
        http=guarded_protocol(config.http, app.state.refusals),
        ws="none",
        lifespan="on",
        backlog=BACKLOG,
        timeout_keep_alive=max(1, int(config.http.idle_timeout)),
        callback_notify=heartbeat.beat,
        timeout_notify=HEARTBEAT_SECONDS,
    )
    for name in ("uvicorn.error", "uvicorn.access"):
        limit(logging.getLogger(name))
    probe = ProbeListener(host, config.probe_port, heartbeat) if config.probe_port else None
    return SidecarServer(uvicorn_config, probe)
