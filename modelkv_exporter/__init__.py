"""modelkv-exporter: GPU memory that models declare outside vLLM's paged KV, as Prometheus metrics.

Three parts, one folder each: ``contract`` (the snapshot and its spool; standard library
only), ``engine`` (inside the engine process: the protocol, publishing, the vLLM hook) and
``sidecar`` (the exporter: metrics, HTTP, landing page). ``cli`` and ``demo`` use them.
``publish`` needs the ``torch`` extra and is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from modelkv_exporter.engine.publish import publish

__all__ = ["__version__", "publish"]


def __getattr__(name: str) -> Any:
    if name == "publish":
        from modelkv_exporter.engine.publish import publish

        return publish
    raise AttributeError(f"module 'modelkv_exporter' has no attribute {name!r}")
