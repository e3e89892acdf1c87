"""What an owner's cache layers held at the peak of each call: their geometry, per cache object, grouped.

A layer's keys are ``[rows, kv_heads, positions, head_dim]``; its positions are counted from the
bytes the observer weighed (the storage behind keys and values), not from the tensor's shape: a
sliding-window layer's 71-position view into a 168-position tensor holds 168. Rows come from the
cache objects live at once (each cache's rows added: one cache per request holds one row each),
layers from the layers of one cache (``testing/caches.py`` says which cache a layer belongs to).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from modelkv_exporter.testing.caches import Where


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
    caches: int = 1
    """The distinct cache objects these layers belong to."""

    @property
    def geometry(self) -> tuple[int, int, str, int]:
        """``(kv_heads, head_dim, dtype, element_size)``: what one declaration shares."""
        return (self.kv_heads, self.head_dim, self.dtype, self.element_size)

    @property
    def text(self) -> str:
        """``8 layers x 2 rows x 168 positions`` (``in 2 caches`` when they are spread over several)."""
        spread = f" in {self.caches} caches" if self.caches > 1 else ""
        return f"{self.layers} layers x {self.rows} rows x {self.positions} positions{spread}"


@dataclass(frozen=True)
class HeldLayers:
    """Layers of one cache object (or part of one) with one geometry, row count and size, at one moment."""

    cache: int
    """The ``id`` of the outermost cache they belong to; 0: none is known (each such layer counts as one cache)."""
    part: int
    """The ``id`` of the cache holding them directly (an encoder-decoder cache's self- or cross-attention cache)."""
    group: LayerGroup


@dataclass(frozen=True)
class Shape:
    """One geometry's layers at one moment, folded into a declaration's terms."""

    kv_heads: int
    head_dim: int
    dtype: str
    element_size: int
    layers: int
    """The layers of one cache (the most one cache, or one part of an encoder-decoder cache, held)."""
    rows: int
    """Rows held: each cache's rows added (over the caches a sequence has, see ``per_sequence``)."""
    positions: int
    """Positions a row across the ``layers``, every layer added (rounded up)."""
    groups: tuple[LayerGroup, ...]
    caches: int = 1
    """Distinct cache objects live at once."""
    row_positions: int = 0
    """Positions held, every row of every layer added: what ``positions`` is folded from."""

    @property
    def bytes(self) -> int:
        """Bytes the groups held."""
        return sum(group.bytes for group in self.groups)

    @property
    def groups_text(self) -> str:
        """The groups, largest first, for evidence."""
        return ", ".join(group.text for group in self.groups)

    def per_sequence(self, copies: int) -> Shape:
        """The shape when each sequence has a row in ``copies`` caches (a retained cache and a working copy):
        rows divided, positions a row added up."""
        if copies <= 1 or self.rows % copies:
            return self
        rows = self.rows // copies
        return replace(self, rows=rows, positions=_ceil(self.row_positions, self.layers * rows))


def _ceil(numerator: int, denominator: int) -> int:
    return -(-numerator // max(1, denominator))


@dataclass(frozen=True)
class CallPeak:
    """An owner's caches at the most they held within one call into it."""

    call: int
    """The owner's call number (1 = its first outermost call)."""
    batch: int | None
    """The batch size the author said this call ran at (``run.batch(n)``), if any."""
    bytes: int
    held: tuple[HeldLayers, ...]
    other_bytes: int = 0
    """Bytes in layers without a ``[rows, kv_heads, positions, head_dim]`` key tensor."""

    @property
    def groups(self) -> tuple[LayerGroup, ...]:
        """The layers by geometry, rows and positions, whatever cache holds them; the largest first."""
        merged: dict[tuple[int, int, int, str, int, int], tuple[int, int, set[int]]] = {}
        for item in self.held:
            g = item.group
            key = (g.rows, g.kv_heads, g.head_dim, g.dtype, g.element_size, g.positions)
            layers, size, caches = merged.get(key, (0, 0, set()))
            caches.add(item.cache)
            merged[key] = (layers + g.layers, size + g.bytes, caches)
        groups = [
            LayerGroup(rows, heads, head_dim, dtype, element, positions, layers, size, len(caches))
            for (rows, heads, head_dim, dtype, element, positions), (layers, size, caches) in merged.items()
        ]
        return tuple(sorted(groups, key=lambda g: (-g.bytes, g.positions)))

    @property
    def rows(self) -> int:
        """The most rows one geometry's caches held together."""
        return max((shape.rows for shape in self.shapes()), default=0)

    @property
    def caches(self) -> int:
        """Distinct cache objects live at the peak."""
        return len({item.cache for item in self.held})

    @property
    def longest(self) -> int:
        """The most positions one row of one layer held."""
        return max((item.group.positions for item in self.held), default=0)

    def shapes(self, copies: int = 1) -> tuple[Shape, ...]:
        """The layers folded per geometry, the largest first (``copies``: the caches a sequence has a row in)."""
        by_geometry: dict[tuple[int, int, str, int], list[HeldLayers]] = {}
        for item in self.held:
            by_geometry.setdefault(item.group.geometry, []).append(item)
        shapes = [fold(items).per_sequence(copies) for items in by_geometry.values()]
        return tuple(sorted(shapes, key=lambda shape: -shape.bytes))


def fold(items: list[HeldLayers]) -> Shape:
    """One geometry's layers as one declaration: the layers of one cache, every cache's rows, positions a row."""
    part_layers: dict[int, int] = {}
    cache_rows: dict[int, int] = {}
    for item in items:
        part_layers[item.part] = part_layers.get(item.part, 0) + item.group.layers
        cache_rows[item.cache] = max(cache_rows.get(item.cache, 0), item.group.rows)
    layers = max(part_layers.values())
    rows = sum(cache_rows.values())
    row_positions = sum(i.group.layers * i.group.rows * i.group.positions for i in items)
    first = items[0].group
    groups = CallPeak(0, None, 0, tuple(items)).groups
    return Shape(
        first.kv_heads,
        first.head_dim,
        first.dtype,
        first.element_size,
        layers,
        rows,
        _ceil(row_positions, layers * rows),
        groups,
        len(cache_rows),
        row_positions,
    )


Geometry = tuple[int, int, int, str, int, int]
"""``(rows, kv_heads, head_dim, dtype, element_size, positions)`` of one part of a layer."""


def _geometry(keys: Any, size: int) -> Geometry | None:
    """The geometry of ``size`` bytes held as pairs of tensors shaped like ``keys`` ``[rows, kv_heads, positions,
    head_dim]`` (keys and values: two of them a position), or None for another shape."""
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


def layer_geometry(layer: Any, size: int) -> Geometry | None:
    """``(rows, kv_heads, head_dim, dtype, element_size, positions)`` of a layer weighing ``size`` bytes, or None."""
    return _geometry(layer.__dict__.get("keys"), size)


def layer_parts(layer: Any, size: int) -> list[tuple[Geometry | None, int]]:
    """A layer's bytes by what holds them: its keys and values, then each other kind of tensor it keeps (scales:
    the tensors of one shape and dtype, a pair for keys and values), each storage once. A backing buffer that keys
    and values are views of adds nothing; a layer with nothing beyond keys and values is one part of ``size``."""
    from modelkv_exporter.engine.observe.layers import kv_names, plan_for
    from modelkv_exporter.engine.tensors import StorageKey, weigh

    state = layer.__dict__
    names = kv_names(state, plan_for(type(layer)))
    if names == ("keys", "values") or not set(names) - {"keys", "values"}:
        return [(layer_geometry(layer, size), size)]
    found: dict[StorageKey, int] = {}
    for name in ("keys", "values"):
        weigh(state.get(name), found)
    parts: list[tuple[Geometry | None, int]] = [(layer_geometry(layer, sum(found.values())), sum(found.values()))]
    kinds: dict[tuple[object, ...], list[Any]] = {}
    for name in names[2:]:
        value = state.get(name)
        for tensor in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(tensor, torch.Tensor):
                kinds.setdefault((tuple(tensor.shape), tensor.dtype), []).append(tensor)
    for same in kinds.values():
        before = dict(found)
        for tensor in same:
            weigh(tensor, found)
        added = sum(found.values()) - sum(before.values())
        if added:
            parts.append((_geometry(same[0], added), added))
    return parts


def group_layers(
    layers: Iterable[tuple[Any, int]], where: Mapping[int, Where] | None = None
) -> tuple[tuple[HeldLayers, ...], int]:
    """``(layer, bytes)`` pairs grouped by the cache they belong to (``where``, by ``id``), geometry and positions;
    and the bytes of layers without a geometry. A layer of no known cache is grouped with the others of none."""
    where = where or {}
    counts: dict[tuple[int, int, Geometry], tuple[int, int]] = {}
    other = 0
    for layer, size in layers:
        if size <= 0:
            continue
        for key, part_bytes in layer_parts(layer, size):
            if key is None:
                other += part_bytes
                continue
            cache, part = where.get(id(layer), (0, 0))
            count, total = counts.get((cache, part, key), (0, 0))
            counts[(cache, part, key)] = (count + 1, total + part_bytes)
    held = tuple(
        HeldLayers(cache, part, LayerGroup(rows, heads, head_dim, dtype, element, positions, count, total))
        for (cache, part, (rows, heads, head_dim, dtype, element, positions)), (count, total) in counts.items()
    )
    return held, other
