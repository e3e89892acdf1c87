"""The demo's listening socket, bound before anything slow starts (stdlib only, imported before torch)."""

from __future__ import annotations

import socket


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


def taken_port_message(host: str, port: int, error: OSError) -> str:
    """What to tell a user whose demo port cannot be bound: the flag and the variable that change it."""
    return (
        f"modelkv-exporter demo: cannot listen on {host}:{port} ({error.strerror or error}); "
        "choose another port with --port or MODELKV_PORT (for example: MODELKV_PORT=9401 make demo)"
    )
