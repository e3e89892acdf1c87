"""What an owner's cache layers held at the peak of each call: their geometry, grouped.

A layer's keys are ``[rows, kv_heads, positions, head_dim]``; its positions are counted from the
bytes the observer weighed (the storage behind keys and values), not from the tensor's shape: a
sliding-window layer's 71-position view into a 168-position tensor holds 168.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LayerGroup:
    """Layers of one geometry and size held at the same moment."""

    rows: int
    kv_heads: int
    head_dim: int
    dtype: str
    element_size: int
    positions: int
    """Positions one row of one layer held (storage, rounded up)."""
    layers: int
    bytes: int

    @property
    def geometry(self) -> tuple[int, int, str, int]:
        """``(kv_heads, head_dim, dtype, element_size)``: what one declaration shares."""
        return (self.kv_heads, self.head_dim, self.dtype, self.element_size)

    @property
    def text(self) -> str:
        """``8 layers x 2 rows x 168 positions``."""
        return f"{self.layers} layers x {self.rows} rows x {self.positions} positions"


@dataclass(frozen=True)
class Shape:
    """One geometry's layers at one moment, folded into a declaration's terms."""

    kv_heads: int
    head_dim: int
    dtype: str
    element_size: int
    layers: int
    """The layer count the groups share (their greatest common divisor)."""
    rows: int
    """The most rows any layer held."""
    positions: int
    """Positions a row across the ``layers``, every group added (rounded up)."""
    groups: tuple[LayerGroup, ...]

    @property
    def bytes(self) -> int:
        """Bytes the groups held."""
        return sum(group.bytes for group in self.groups)

    @property
    def groups_text(self) -> str:
        """The groups, largest first, for evidence."""
        return ", ".join(group.text for group in self.groups)


@dataclass(frozen=True)
class CallPeak:
    """An owner's caches at the most they held within one call into it."""

    call: int
    """The owner's call number (1 = its first outermost call)."""
    batch: int | None
    """The batch size the author said this call ran at (``run.batch(n)``), if any."""
    bytes: int
    groups: tuple[LayerGroup, ...]
    other_bytes: int = 0
    """Bytes in layers without a ``[rows, kv_heads, positions, head_dim]`` key tensor."""

    @property
    def rows(self) -> int:
        """The most rows any layer held."""
        return max((group.rows for group in self.groups), default=0)

    @property
    def longest(self) -> int:
        """The most positions one row of one layer held."""
        return max((group.positions for group in self.groups), default=0)

    def shapes(self) -> tuple[Shape, ...]:
        """The groups folded per geometry, the largest first."""
        by_geometry: dict[tuple[int, int, str, int], list[LayerGroup]] = {}
        for group in self.groups:
            by_geometry.setdefault(group.geometry, []).append(group)
        shapes = [fold(groups) for groups in by_geometry.values()]
        return tuple(sorted(shapes, key=lambda shape: -shape.bytes))


def fold(groups: list[LayerGroup]) -> Shape:
    """One geometry's groups as one declaration: shared layer count, the most rows, positions a row added up."""
    layers = 0
    for group in groups:
        layers = math.gcd(layers, group.layers)
    rows = max(group.rows for group in groups)
    row_positions = sum(group.layers * group.rows * group.positions for group in groups)
    first = groups[0]
    ordered = tuple(sorted(groups, key=lambda g: (-g.bytes, g.positions)))
    return Shape(
        first.kv_heads,
        first.head_dim,
        first.dtype,
        first.element_size,
        layers,
        rows,
        -(-row_positions // (layers * rows)),
        ordered,
    )


def layer_geometry(layer: Any, size: int) -> tuple[int, int, int, str, int, int] | None:
    """``(rows, kv_heads, head_dim, dtype, element_size, positions)`` of a layer weighing ``size`` bytes, or None."""
    keys = layer.__dict__.get("keys")
    shape = getattr(keys, "shape", None)
    if shape is None or len(shape) != 4:
        return None
    rows, heads, _, head_dim = (int(n) for n in shape)
    element = int(keys.element_size())
    per_position = 2 * rows * heads * head_dim * element
    if per_position <= 0:
        return None
    dtype = str(keys.dtype).removeprefix("torch.")
    return rows, heads, head_dim, dtype, element, -(-size // per_position)


def group_layers(layers: Iterable[tuple[Any, int]]) -> tuple[tuple[LayerGroup, ...], int]:
    """``(layer, bytes)`` pairs grouped by geometry and positions; and the bytes of layers without a geometry."""
    counts: dict[tuple[int, int, int, str, int, int], tuple[int, int]] = {}
    other = 0
    for layer, size in layers:
        if size <= 0:
            continue
        key = layer_geometry(layer, size)
        if key is None:
            other += size
            continue
        count, total = counts.get(key, (0, 0))
        counts[key] = (count + 1, total + size)
    groups = tuple(
        LayerGroup(rows, heads, head_dim, dtype, element, positions, count, total)
        for (rows, heads, head_dim, dtype, element, positions), (count, total) in counts.items()
    )
    return groups, other
