"""Probes never starve: the liveness port answers from its own thread, and spool work never runs on the event loop.

Real uvicorn servers in this process, so that a test can hold the event loop or a rendering
on purpose; each mechanism is also shown failing when it is taken away.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.http import routes
from modelkv_exporter.sidecar.http.limits import HttpLimits
from modelkv_exporter.sidecar.http.server import SidecarServer
from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig
from modelkv_testbed.polling import eventually
from modelkv_testbed.processes import InThread, free_port, serving_in_thread, wait_http
from modelkv_testbed.snapshots import make_snapshot


def on_loop(served: InThread, call: Callable[[], Any]) -> None:
    """Run ``call`` on the server's event loop (which it blocks for as long as it runs)."""
    loop = next(iter(served.server.servers)).get_loop()  # type: ignore[attr-defined]
    loop.call_soon_threadsafe(call)


def _stall_after_one_and_a_half_seconds(server: SidecarServer) -> None:
    assert server.probe is not None
    server.probe.max_stall = 1.5


@pytest.fixture
def served(spool: Path) -> Iterator[InThread]:
    write_snapshot(spool, make_snapshot("e"))
    config = SidecarConfig(spool, probe_port=free_port(), http=HttpLimits(idle_timeout=1))
    with serving_in_thread(config, _stall_after_one_and_a_half_seconds) as running:
        yield running


def test_the_liveness_port_reports_a_stalled_event_loop_without_waiting_for_it(served: InThread) -> None:
    assert httpx.get(served.probe_url + "/healthz").text == "ok\n"
    release = threading.Event()
    on_loop(served, lambda: release.wait(20))  # the event loop is stuck until released
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.get(served.url + "/healthz", timeout=2)  # the main port waits for the loop
        stalled = eventually(
            lambda: (r := httpx.get(served.probe_url + "/healthz", timeout=2)).status_code == 503 and r,
            "the liveness port to report the stall",
        )
        assert stalled.text == "event loop stalled\n"
    finally:
        release.set()
    eventually(lambda: httpx.get(served.probe_url + "/healthz").status_code == 200, "healthy again once it turns")


def test_the_liveness_port_says_starting_until_the_main_port_serves(
    spool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A startup probe must not pass while the app is still starting and the main port does not listen."""
    release = threading.Event()
    real_startup = uvicorn.Server.startup

    async def held_startup(self: uvicorn.Server, sockets: Any = None) -> None:
        while not release.is_set():  # the app's start takes a while (a slow volume, a busy node)
            await asyncio.sleep(0.01)
        await real_startup(self, sockets)

    monkeypatch.setattr(uvicorn.Server, "startup", held_startup)
    with serving_in_thread(SidecarConfig(spool, probe_port=free_port()), ready=None) as running:
        try:
            starting = eventually(
                lambda: (r := httpx.get(running.probe_url + "/healthz", timeout=2)).status_code == 503 and r,
                "the liveness listener to answer while the app starts",
            )
            assert starting.text == "starting\n"
            with pytest.raises(httpx.ConnectError):
                httpx.get(running.url + "/healthz", timeout=2)
            release.set()
            eventually(lambda: httpx.get(running.probe_url + "/healthz").status_code == 200, "ok once it serves")
            assert httpx.get(running.url + "/healthz").status_code == 200
        finally:
            release.set()


def test_a_slow_rendering_never_holds_the_event_loop(served: InThread, monkeypatch: pytest.MonkeyPatch) -> None:
    _hold_renders(served, monkeypatch, inline=False)


def test_the_same_rendering_on_the_loop_would_starve_healthz(served: InThread, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(httpx.TimeoutException):
        _hold_renders(served, monkeypatch, inline=True)


def _hold_renders(served: InThread, monkeypatch: pytest.MonkeyPatch, *, inline: bool) -> None:
    """Hold every rendering of /metrics until released; meanwhile /healthz on the main port must answer."""
    app = served.server.config.app
    exposition = app.state.exposition
    entered, release = threading.Event(), threading.Event()
    real = exposition.render

    def held(**kwargs: Any) -> Any:
        entered.set()
        release.wait(20)
        return real(**kwargs)

    monkeypatch.setattr(exposition, "render", held)
    if inline:  # the mechanism taken away: spool work run on the event loop

        async def on_the_loop(app: Any, work: Callable[[], Any]) -> Any:
            return work()

        monkeypatch.setattr(routes, "in_worker", on_the_loop)
    scrape = threading.Thread(target=lambda: httpx.get(served.url + "/metrics", timeout=30), daemon=True)
    scrape.start()
    try:
        assert entered.wait(10), "the scrape reached the rendering"
        assert httpx.get(served.url + "/healthz", timeout=2).text == "ok\n"
    finally:
        release.set()
        scrape.join(timeout=30)


def test_pages_render_once_per_spool_change(served: InThread, spool: Path) -> None:
    pages = served.server.config.app.state.pages
    for _ in range(20):
        assert httpx.get(served.url + "/api/v1/engines").status_code == 200
    assert pages.renders == 1
    for _ in range(5):
        assert httpx.get(served.url + "/").status_code == 200
    assert pages.renders in (2, 3), "one page, once more only if its 5 s age step passed"
    write_snapshot(spool, replace(make_snapshot("e"), writer="changed"))
    document = eventually(
        lambda: (
            (r := httpx.get(served.url + "/api/v1/engines").json())["engines"][0]["snapshot"]["writer"] == "changed"
            and r
        ),
        "the document of the changed spool",
    )
    assert document["engines"][0]["state"] == "exported"


def test_the_stock_protocol_buffers_an_endless_head_where_the_guarded_one_stops(tmp_path: Path) -> None:
    """The head limit is ours: uvicorn's own protocol keeps reading a head that never ends."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    port = free_port()
    stock = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http="httptools", log_level="error"))
    thread = threading.Thread(target=stock.run, daemon=True)
    thread.start()
    try:
        wait_http(f"http://127.0.0.1:{port}/")
        assert _head_bytes_taken(port, limit=4 * 1024 * 1024) >= 4 * 1024 * 1024, "read on and on"
    finally:
        stock.should_exit = True
        thread.join(timeout=10)


def _head_bytes_taken(port: int, limit: int) -> int:
    """How many bytes of one endless head the server reads before it answers or stops reading (up to ``limit``)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n")
        try:
            while sent < limit:
                sock.sendall(b"X-a: b\r\n" * 8192)
                sent += 8 * 8192
        except OSError:
            pass
    return sent


def test_the_guarded_protocol_stops_reading_at_the_head_limit(served: InThread) -> None:
    port = int(served.url.rsplit(":", 1)[1])
    started = time.monotonic()
    taken = _head_bytes_taken(port, limit=4 * 1024 * 1024)
    assert taken < 4 * 1024 * 1024, f"refused after {taken} bytes ({time.monotonic() - started:.1f} s)"
