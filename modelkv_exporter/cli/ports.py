"""Binding the commands' ports before anything slow starts, and what to say when one is taken.

``serve`` and the demo bind their HTTP port here (uvicorn then serves the bound socket), and
``serve`` binds its liveness port before the server starts, so a taken port ends the command at
once with one line naming the port, the flag and the variable, and a port that was free a moment ago.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Collection

from modelkv_exporter.sidecar.http.liveness_port import ProbeListener
from modelkv_exporter.sidecar.http.sidecar_config import PROBE_PORT

SUGGESTION_RANGE = 100
"""How many ports above a taken one are tried for a suggestion before the system picks one."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` as uvicorn binds one; ``OSError`` when the address is taken or wrong."""
    family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, protocol)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def _free(host: str, port: int) -> bool:
    try:
        listening_socket(host, port).close()
    except OSError:
        return False
    return True


def free_port_near(host: str, port: int, avoid: Collection[int]) -> int:
    """A port above ``port`` that ``host`` could bind a moment ago and that is not in ``avoid``.

    ``avoid`` holds ports with another use (the liveness port): a free one of them is still a bad
    suggestion. When none of the next ``SUGGESTION_RANGE`` ports is free, the system picks one.
    """
    for candidate in range(port + 1, min(port + 1 + SUGGESTION_RANGE, 65536)):
        if candidate not in avoid and _free(host, candidate):
            return candidate
    with listening_socket(host, 0) as sock:
        return int(sock.getsockname()[1])


def taken_port_message(
    command: str, purpose: str, host: str, port: int, error: OSError, change: str, example: str
) -> str:
    """One line for a port that cannot be bound: which port and what for, why, and how to choose another."""
    return (
        f"modelkv-exporter {command}: cannot listen on {host}:{port}, {purpose} ({error.strerror or error}); "
        f"choose another port with {change} (for example: {example})"
    )


def bind_http_port(command: str, host: str, port: int, probe_port: int, example: str) -> socket.socket | None:
    """The command's HTTP socket, bound; ``None`` when the port is taken, after one line on stderr saying so.

    ``example`` is how to choose another, with ``{port}`` where a free port goes.
    """
    try:
        return listening_socket(host, port)
    except OSError as error:
        other = free_port_near(host, port, {probe_port, PROBE_PORT})
        change = "--port or MODELKV_PORT"
        print(
            taken_port_message(command, "its HTTP port", host, port, error, change, example.format(port=other)),
            file=sys.stderr,
        )
        return None


def bind_probe_port(command: str, probe: ProbeListener, http_port: int) -> bool:
    """Bind the liveness listener's port now; ``False`` when it is taken, after one line on stderr saying so."""
    try:
        probe.bind()
    except OSError as error:
        other = free_port_near(probe.host, probe.port, {http_port})
        example = f"--probe-port {other}, or 0 to turn the listener off"
        change = "--probe-port or MODELKV_PROBE_PORT"
        message = taken_port_message(command, "its liveness probe port", probe.host, probe.port, error, change, example)
        print(message, file=sys.stderr)
        return False
    return True
