"""The key/value geometry seen in a discovered owner's ``transformers`` cache layers.

A layer's keys are ``[rows, kv_heads, positions, head_dim]``. Across an owner's live layers:
``layers`` is the most layers one cache held, ``rows`` the rows of all its caches together,
``positions`` the most positions one row's storage held (a sliding window's view counts the whole
tensor behind it). Only where every layer agrees on kv heads, head dim and dtype; otherwise, or for
tensors of any other shape (a census finds tensors, not layers), there is no layout.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from modelkv_exporter.contract.snapshot import KVLayout
from modelkv_exporter.engine.discover import safe
from modelkv_exporter.engine.observe.records import LayerRecord
from modelkv_exporter.engine.tensors import dispatches_to_python


def seen_layout(records: Iterable[LayerRecord]) -> KVLayout | None:
    """The geometry of the live layers behind ``records`` now; None when there is none or it is mixed.

    Read through the layers' real ``__dict__`` and with ``__torch_function__`` off, from tensors whose sizes reach no
    ``__torch_dispatch__`` (``engine.tensors.dispatches_to_python``; the others are left out): no code of a tensor
    subclass runs.
    """
    with torch._C.DisableTorchFunction():
        return _seen_layout(records)


def _seen_layout(records: Iterable[LayerRecord]) -> KVLayout | None:
    kinds: set[tuple[int, int, torch.dtype]] = set()
    groups: dict[int, list[int]] = {}
    positions = 0
    for record in records:
        layer = record()
        attributes = None if layer is None else safe.instance_dict(layer)
        keys: Any = None if attributes is None else attributes.get("keys")
        if safe.kind(type(keys)) is not safe.Kind.TENSOR or dispatches_to_python(keys) or keys.dim() != 4:
            continue
        rows, heads, held, head_dim = keys.shape
        if not heads or not head_dim:
            continue
        kinds.add((heads, head_dim, keys.dtype))
        row_bytes = heads * head_dim * keys.element_size() * max(rows, 1)
        stored = keys.untyped_storage().nbytes() // row_bytes
        positions = max(positions, held, stored)
        group = getattr(record, "group", 0) or -record.key
        groups.setdefault(group, []).append(rows)
    if len(kinds) != 1:
        return None
    ((heads, head_dim, dtype),) = kinds
    return KVLayout(
        layers=max(len(rows) for rows in groups.values()),
        kv_heads=heads,
        head_dim=head_dim,
        dtype=str(dtype).removeprefix("torch."),
        element_size=torch.empty((), dtype=dtype).element_size(),
        positions=positions,
        rows=sum(max(rows) for rows in groups.values()),
    )


def widest(old: KVLayout | None, new: KVLayout | None) -> KVLayout | None:
    """The larger figures of two layouts of the same geometry (the newer one where the geometry changed)."""
    if old is None or new is None:
        return new or old
    if (old.kv_heads, old.head_dim, old.dtype) != (new.kv_heads, new.head_dim, new.dtype):
        return new
    return KVLayout(
        layers=max(old.layers, new.layers),
        kv_heads=new.kv_heads,
        head_dim=new.head_dim,
        dtype=new.dtype,
        element_size=new.element_size,
        positions=max(old.positions, new.positions),
        rows=max(old.rows, new.rows),
    )
