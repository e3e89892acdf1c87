"""The sidecar over HTTP: one FastAPI app, one router, read-only.

- ``config``: ``SidecarConfig``, the sidecar's configuration, every field a setting but the spool directory;
- ``app``: ``make_app``, the app factory (one spool, its exposition cache, its router);
- ``routes``: every route: ``/metrics``, ``/healthz``, ``/readyz``, ``/api/v1/engines``, ``/``;
- ``landing``: the landing page; ``engines_document``: the JSON document of the spool;
- ``server``: the uvicorn server that serves the app.
"""
