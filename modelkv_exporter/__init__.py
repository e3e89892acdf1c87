"""modelkv-exporter: GPU memory that models declare outside vLLM's paged KV, as Prometheus metrics.

Three parts, one folder each: ``contract`` (the snapshot and its spool; standard library
only), ``engine`` (inside the engine process: the protocol, publishing, the vLLM hook) and
``sidecar`` (the exporter: metrics, HTTP, landing page). ``cli`` and ``demo`` use them;
``testing`` is a model author's check and ``judging`` the verdict it shares with ``cli`` and the
sidecar; ``protocol`` is the model authors' import path of the declaration protocol. See
docs/architecture.md. ``publish`` needs the ``torch`` extra and is imported on first use; ``__version__`` is the
installed package's (``contract.version``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modelkv_exporter.engine.publish import publish

    __version__: str

__all__ = ["__version__", "publish"]


def __getattr__(name: str) -> Any:
    if name == "publish":
        from modelkv_exporter.engine.publish import publish

        return publish
    if name == "__version__":
        from modelkv_exporter.contract.version import VERSION

        return VERSION
    raise AttributeError(f"module 'modelkv_exporter' has no attribute {name!r}")
