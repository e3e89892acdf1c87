"""The defaults of the limits the sidecar enforces on the spool and on its HTTP clients.

Each is a setting (``contract.settings``); ``docs/reliability.md`` measures the memory they
bound against the sidecar's 192 MiB limit in ``deploy/kubernetes``.
"""

from __future__ import annotations

MAX_DECLARATIONS = 256
"""Declarations in one snapshot (real models declare a few; one per cache-owning module class)."""

MAX_LABEL_BYTES = 256 * 1024
"""Bytes of label values over all the series one snapshot exports."""

MAX_SERIES = 10_000
"""Series of all engines in one scrape (the exporter's own come on top)."""

MAX_SCRAPE_LABEL_BYTES = 4 * 1024 * 1024
"""Bytes of label values of all engines' series in one scrape."""

PROBE_PORT = 9401
"""The liveness port, answered from its own thread."""

HTTP_MAX_CONNECTIONS = 256
HTTP_MAX_LINE_BYTES = 8 * 1024
"""The request line, and each header line."""

HTTP_MAX_HEADER_BYTES = 64 * 1024
"""The whole head: request line and headers (Prometheus sends under 1 KiB, 5 KiB with a bearer token)."""

HTTP_MAX_HEADERS = 100
HTTP_MAX_BODY_BYTES = 64 * 1024
"""No route reads a body: a larger declared body is refused, a smaller one dropped."""

HTTP_HEADER_TIMEOUT = 10.0
"""Seconds from a head's first byte to its end, however slowly the bytes come."""

HTTP_IDLE_TIMEOUT = 5.0
"""Seconds a connection may wait for its next request (uvicorn's keep-alive default)."""

HTTP_SEND_TIMEOUT = 30.0
"""Seconds a client has to take a response after it was written."""

HTTP_MAX_UNSENT_BYTES = 32 * 1024 * 1024
"""Response bytes written but not yet taken by their clients, all connections together."""
