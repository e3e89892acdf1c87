"""What ``guard`` uses of uvicorn's httptools protocol that uvicorn does not document, checked when a server is built.

``guard.GuardedProtocol`` subclasses uvicorn's ``HttpToolsProtocol`` (why, name by name, is written at the top
of ``guard.py``). It overrides or calls the methods in ``METHODS``, reads and sets the instance attributes in
``PROTOCOL_ATTRIBUTES``, and those of the request cycle (``RequestResponseCycle``) in ``CYCLE_ATTRIBUTES``. A
uvicorn that renamed any of them would fail inside a request; ``check_uvicorn_surface`` fails at start-up instead.
An instance attribute is found where the class's ``__init__`` assigns it (``self.name = ...``), read from
uvicorn's source as the interpreter holds it; uvicorn ships its sources, and without them the check fails too.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

from uvicorn.protocols.http import httptools_impl

METHODS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "pause_writing",
    "resume_writing",
    "on_message_begin",
    "on_url",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "send_400_response",
    "_unset_keepalive_if_required",
)
"""The protocol's methods ``guard`` overrides or calls."""

PROTOCOL_ATTRIBUTES = ("transport", "scope", "cycle", "pipeline", "parser")
"""The protocol's instance attributes ``guard`` reads or sets."""

CYCLE_ATTRIBUTES = ("response_started", "response_complete", "disconnected", "message_event")
"""The request cycle's (``protocol.cycle``) instance attributes ``guard`` reads or sets."""


def assigned_attributes(cls: type) -> frozenset[str]:
    """The instance attributes ``cls.__init__`` assigns (``self.name = ...``, annotated or not), from its source.

    Raises ``OSError`` when the source cannot be read, ``TypeError`` when ``cls`` has no ``__init__`` of its own
    written in Python.
    """
    init = vars(cls).get("__init__")
    if init is None:
        raise TypeError(f"{cls.__name__} has no __init__ of its own")
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = [
                t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])
            ]
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found.add(target.attr)
    return frozenset(found)


def missing_names(protocol: type | None, cycle: type | None) -> list[str]:
    """What of the surface ``protocol`` and ``cycle`` (uvicorn's classes, or None where uvicorn has none) lack."""
    if protocol is None or cycle is None:
        return [
            name for name, kind in (("HttpToolsProtocol", protocol), ("RequestResponseCycle", cycle)) if kind is None
        ]
    missing = [name for name in METHODS if not callable(getattr(protocol, name, None))]
    for kind, names in ((protocol, PROTOCOL_ATTRIBUTES), (cycle, CYCLE_ATTRIBUTES)):
        try:
            assigned = assigned_attributes(kind)
        except (OSError, TypeError) as error:
            missing.append(f"{kind.__name__}.__init__ (its source cannot be read: {error})")
            continue
        missing += [f"{kind.__name__}.{name}" for name in names if name not in assigned]
    return missing


def check_uvicorn_surface() -> None:
    """Fail when the server is built, not under attack, if this uvicorn lacks a name ``guard`` uses."""
    missing = missing_names(
        getattr(httptools_impl, "HttpToolsProtocol", None), getattr(httptools_impl, "RequestResponseCycle", None)
    )
    if missing:
        raise RuntimeError(f"uvicorn's httptools protocol has no {missing}: this uvicorn is not supported")
