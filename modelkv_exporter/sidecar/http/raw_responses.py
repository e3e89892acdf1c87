"""Complete HTTP/1.1 responses written as bytes, for the two places that answer below any framework.

The guard refuses a request before uvicorn's app sees it, and the liveness listener answers the
kubelet without uvicorn at all: both send a short plain-text answer and close the connection.
Standard library only, so the liveness listener stays free of uvicorn.
"""

from __future__ import annotations

from http import HTTPStatus


def closing_response(status: int, body: str | None = None) -> bytes:
    """A plain-text answer with ``status`` that closes the connection; the body is the status phrase unless given."""
    phrase = HTTPStatus(status).phrase
    content = (f"{phrase}\n" if body is None else body).encode()
    head = (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(content)}\r\nconnection: close\r\n"
    )
    return head.encode() + b"\r\n" + content
