"""The key/value layout of the plain tensors an owner holds (in no cache layer), where one can be read.

The census weighs an owner's plain tensors by storage; their shapes say more only where they are keys and values:
4-dimensional tensors ``[rows, kv_heads, positions, head_dim]`` of one shape and dtype, an even number of them (a
key and a value tensor a layer), holding every byte the census found. Their storage is what the owner allocated,
so ``positions`` is the capacity a row (a ring preallocated for its window holds it whatever was written). Anything
else (flattened buffers, mixed shapes, tensors in objects the owner's attributes do not hold directly) is judged by
its bytes only, and the reason says why. Only the owner's own attributes are read (its ``__dict__``, and the lists,
tuples and dicts in it), never its properties or methods.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from modelkv_exporter.engine import tensors
from modelkv_exporter.engine.observe.layers import StorageKey
from modelkv_exporter.testing.peak_layout import Shape

MODULE_PARTS = frozenset({"_parameters", "_buffers", "_modules"})
"""``nn.Module``'s own tables: parameters, buffers and sub-modules are never plain cache tensors of the owner."""


@dataclass(frozen=True)
class PlainLayout:
    """What the plain tensors' shapes say: a ``Shape`` to suggest from, or why there is none (bytes only)."""

    shape: Shape | None
    reason: str
    """How the layout was read, or why none could be."""


def _held(owner: object) -> list[torch.Tensor]:
    try:
        attributes = object.__getattribute__(owner, "__dict__")
    except AttributeError:
        return []
    found: list[torch.Tensor] = []
    for name, value in dict.items(attributes):
        if name in MODULE_PARTS:
            continue
        items = (
            list.__iter__(value)
            if type(value) is list
            else tuple.__iter__(value)
            if type(value) is tuple
            else dict.values(value)
            if type(value) is dict
            else (value,)
        )
        found += [item for item in items if type(item) is torch.Tensor]
    return found


def plain_layout(owner: object, plain_bytes: int) -> PlainLayout:
    """The layout of the plain tensors ``owner`` holds, which the census weighed at ``plain_bytes``."""
    held = _held(owner)
    kv = [tensor for tensor in held if tensor.dim() == 4]
    if not kv:
        return PlainLayout(None, "bytes only: no key/value layout, no [rows, kv_heads, positions, head_dim] tensor")
    kinds = {(tuple(tensor.shape), tensor.dtype) for tensor in kv}
    if len(kinds) > 1:
        return PlainLayout(None, f"bytes only: no key/value layout, {len(kinds)} tensor shapes or dtypes")
    if len(kv) % 2:
        return PlainLayout(None, f"bytes only: no key/value layout, {len(kv)} tensors are not keys and values")
    weighed: dict[StorageKey, int] = {}
    for tensor in kv:
        tensors.weigh(tensor, weighed)
    if sum(weighed.values()) != plain_bytes:
        return PlainLayout(
            None,
            f"bytes only: no key/value layout, the [rows, kv_heads, positions, head_dim] tensors hold "
            f"{sum(weighed.values()):,} B of the {plain_bytes:,} B found",
        )
    ((shape, dtype),) = kinds
    rows, kv_heads, positions, head_dim = shape
    element_size = kv[0].element_size()
    layers = len(kv) // 2
    return PlainLayout(
        Shape(
            kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=str(dtype).removeprefix("torch."),
            element_size=element_size,
            layers=layers,
            rows=rows,
            positions=positions,
            groups=(),
            row_positions=positions * rows * layers,
        ),
        f"read from {len(kv)} tensors {list(shape)} (keys and values of {layers} layers: rows, kv_heads, positions "
        "allocated, head_dim)",
    )
