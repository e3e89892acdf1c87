"""The bytes of a model's weights as its tensors hold them: parameters and buffers, each storage once.

For an engine that keeps no figure of its own (vLLM's runners keep ``model_memory_usage``): the demo
engines, a CPU worker, any engine that publishes with ``build_snapshot``. Walked once, after the
model loaded; no tensor is kept.
"""

from __future__ import annotations

from typing import Any


def model_weight_bytes(model: Any) -> int | None:
    """Bytes of ``model``'s parameters and buffers, views of one storage counted once; None when not a module."""
    tensors = []
    for name in ("parameters", "buffers"):
        listing = getattr(model, name, None)
        if not callable(listing):
            return None
        tensors.append(listing())
    storages: dict[tuple[str, int], int] = {}
    try:
        for group in tensors:
            for tensor in group:
                storage = tensor.untyped_storage()
                storages[(str(tensor.device), int(storage.data_ptr()))] = int(storage.nbytes())
    except Exception:
        return None
    return sum(storages.values())
