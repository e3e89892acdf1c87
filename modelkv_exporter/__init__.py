"""modelkv-exporter: GPU memory that models declare outside vLLM's paged KV, as Prometheus metrics.

The sidecar side (``spool``, ``collector``, ``app``) needs neither torch nor vLLM;
``publish`` and the protocol need the ``torch`` extra and are imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from modelkv_exporter.publishing import publish

__all__ = ["__version__", "publish"]


def __getattr__(name: str) -> Any:
    if name == "publish":
        from modelkv_exporter.publishing import publish

        return publish
    raise AttributeError(f"module 'modelkv_exporter' has no attribute {name!r}")
