"""The guard's start-up check covers every name of uvicorn it uses, methods and instance attributes alike, and
passes on the uvicorn installed (this file runs on the lowest admitted uvicorn too: ``make test``)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from modelkv_exporter.sidecar.http import guard
from modelkv_exporter.sidecar.http.guard import GuardedProtocol
from modelkv_exporter.sidecar.http.uvicorn_surface import (
    CYCLE_ATTRIBUTES,
    METHODS,
    PROTOCOL_ATTRIBUTES,
    assigned_attributes,
    check_uvicorn_surface,
    missing_names,
)

PROTOCOLS = {"self", "victim", "heaviest", "c"}
"""The names ``guard.py`` gives a protocol instance."""


def used_of_uvicorn() -> tuple[set[str], set[str]]:
    """The attributes ``guard.py`` reads or sets on a protocol and on its cycle that ``GuardedProtocol`` does not
    define itself, and the methods it calls through ``super()``."""
    tree = ast.parse(Path(guard.__file__).read_text())
    own = set(vars(GuardedProtocol)) | assigned_attributes(GuardedProtocol)
    on_protocol, on_cycle = set(), set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in PROTOCOLS and node.attr not in own:
            on_protocol.add(node.attr)
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
            on_protocol.add(node.attr)
        elif (isinstance(value, ast.Name) and value.id == "cycle") or (
            isinstance(value, ast.Attribute) and value.attr == "cycle"
        ):
            on_cycle.add(node.attr)
    return on_protocol, on_cycle


def test_the_check_names_every_attribute_of_uvicorn_the_guard_touches() -> None:
    on_protocol, on_cycle = used_of_uvicorn()
    assert {
        "transport",
        "pipeline",
        "cycle",
        "scope",
        "parser",
        "on_url",
        "_unset_keepalive_if_required",
    } <= on_protocol
    assert on_protocol - {"__init__"} <= set(METHODS) | set(PROTOCOL_ATTRIBUTES), "add it to uvicorn_surface"
    assert on_cycle and on_cycle <= set(CYCLE_ATTRIBUTES), "add it to uvicorn_surface.CYCLE_ATTRIBUTES"


def test_this_uvicorn_has_every_name_the_guard_uses() -> None:
    assert missing_names(HttpToolsProtocol, RequestResponseCycle) == []
    check_uvicorn_surface()


def test_the_attributes_are_those_a_real_protocol_and_cycle_have() -> None:
    """The source reading agrees with live objects: a protocol built as uvicorn builds one, and its cycle."""
    import uvicorn

    async def app(scope: object, receive: object, send: object) -> None:
        return None

    config = uvicorn.Config(app, log_config=None, lifespan="off", http="httptools")
    config.load()
    loop = asyncio.new_event_loop()
    try:
        protocol = HttpToolsProtocol(config, ServerState(), {}, _loop=loop)
        assert all(hasattr(protocol, name) for name in PROTOCOL_ATTRIBUTES)
    finally:
        loop.close()
    assert assigned_attributes(RequestResponseCycle) >= set(CYCLE_ATTRIBUTES)


class _Protocol:
    def __init__(self) -> None:
        self.transport = self.scope = None
        self.cycle: object = None
        self.parser = None

    def on_url(self) -> None: ...


class _Cycle:
    def __init__(self) -> None:
        self.response_started = self.response_complete = False
        self.disconnected = False


def test_a_uvicorn_without_a_name_is_refused_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = missing_names(_Protocol, _Cycle)
    assert "_Protocol.pipeline" in missing and "_Cycle.message_event" in missing and "connection_made" in missing
    assert "_Protocol.transport" not in missing and "on_url" not in missing
    assert missing_names(None, _Cycle) == ["HttpToolsProtocol"]
    nameless = type("Built", (), {"__init__": eval("lambda self: None")})
    assert "Built.__init__ (its source cannot be read" in " ".join(missing_names(nameless, _Cycle))
    monkeypatch.delattr(httptools_impl, "RequestResponseCycle")
    with pytest.raises(RuntimeError, match="RequestResponseCycle"):
        check_uvicorn_surface()
