"""/metrics: the exposition rendered once per spool change, and the content negotiation that picks its form.

- ``lines``: sample lines and family headers, byte for byte as prometheus_client writes them;
- ``deflate``: raw deflate pieces that join into one gzip member;
- ``cache``: ``ExpositionCache``, which keeps every rendered piece keyed by file versions;
- ``negotiation``: OpenMetrics by ``Accept``, gzip by ``Accept-Encoding``.
"""
