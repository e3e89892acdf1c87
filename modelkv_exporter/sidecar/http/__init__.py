"""The sidecar over HTTP: one FastAPI app, one router, read-only.

- ``sidecar_config``: ``SidecarConfig``, the sidecar's configuration, every field a setting but the spool directory;
- ``app``: ``make_app``, the app factory (one spool, its exposition cache, its router);
- ``routes``: every route: ``/metrics``, ``/healthz``, ``/readyz``, ``/api/v1/engines``, ``/``;
- ``pages``: the landing page and the JSON document (``sidecar.presentation``) rendered once per spool change;
- ``sending``: cached bodies sent in small pieces; ``spool_watch``: the warning while the spool is missing;
- ``server``: the uvicorn server that serves the app; ``guard``: uvicorn's httptools protocol held to
  ``limits``, the limits every client is held to, ``uvicorn_surface`` its start-up check of what it uses of
  uvicorn; ``raw_responses``: the responses written below any framework;
- ``liveness_port``: the liveness port, answered from its own thread.
"""
