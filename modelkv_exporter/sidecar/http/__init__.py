"""The sidecar over HTTP: one FastAPI app, one router, read-only.

- ``config``: ``SidecarConfig``, the sidecar's configuration, every field a setting but the spool directory;
- ``app``: ``make_app``, the app factory (one spool, its exposition cache, its router);
- ``routes``: every route: ``/metrics``, ``/healthz``, ``/readyz``, ``/api/v1/engines``, ``/``;
- ``landing``: the landing page; ``owner_chart``: its picture of an engine's owners; ``parts_chart``: its bar of
  an engine's memory by part; ``prescription_section``: its section on what to give vLLM;
  ``post_mortem_section``: its post-mortem of an engine that died;
  ``engines_document``: the JSON document of the spool; ``pages``: both rendered once per spool change;
  ``public``: what clients are shown of the spool;
- ``sending``: cached bodies sent in small pieces; ``spool_watch``: the warning while the spool is missing;
- ``server``: the uvicorn server that serves the app; ``guard``: uvicorn's httptools protocol held to
  ``limits``, the limits every client is held to, ``uvicorn_surface`` its start-up check of what it uses of
  uvicorn; ``answers``: the answers written below any framework;
- ``probe``: the liveness port, answered from its own thread.
"""
