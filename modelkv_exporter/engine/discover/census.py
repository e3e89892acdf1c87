"""The census: every tensor storage reachable from the model's modules, walked in slices.

From each module it follows the attributes the module's own code set (``nn.Module``'s
bookkeeping is skipped), its buffers, and the containers (dicts, lists, tuples, deques, sets) and
plain objects (their ``__dict__`` and ``__slots__``) they hold, to a bounded depth. Parameters are
read only for the baseline; computed weights (the attribute a legacy ``weight_norm`` or
``spectral_norm`` rewrites before every forward) are read with them, at every census, and never
followed as attributes. Modules are visited innermost first (every module before the modules
that contain it), so a storage or a container reachable from several modules belongs to the
innermost one that holds it.

It runs none of the model's code (``safe``): no property, ``__getattr__``, ``__class__``,
``__iter__`` or ``__torch_function__`` of the objects it reads.

``census`` is a generator: it yields whenever a slice has run for ``slice_seconds``, so that the
thread driving it can hand the interpreter back (``run`` sleeps 0 between slices). Every step of a
slice is bounded: a container is walked item by item (a list by index, a dict or a set through its
built-in iterator), resumed across slices, never copied, so a million-element list costs a million
short steps spread over many slices, not one long one; a dict or set that changes size while it is
walked is left where it is (``CensusResult.changed``). Between slices it holds no tensor: a tensor is
weighed when it is reached, and only the containers on the current path (at most ``depth``) are held.
It allocates nothing per object it merely passes over, so its own garbage triggers no full collection.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import torch

from modelkv_exporter.engine.discover import safe
from modelkv_exporter.engine.discover.modules import ModuleMap
from modelkv_exporter.engine.discover.safe import Kind
from modelkv_exporter.engine.modules import MODULE_DICT, computed_weights
from modelkv_exporter.engine.observe.layers import StorageKey

SLICE_SECONDS = 0.0005
"""How long one slice runs before it yields: half a millisecond, leaving room for the steps until the next look
at the clock and for the thread being interrupted (a slice stays under 1 ms of CPU)."""
CHECK_EVERY = 8
"""Steps (items read, tensors weighed) between two looks at the clock."""

MODULE_ATTRIBUTES = frozenset(torch.nn.Module().__dict__)
"""``nn.Module``'s own attributes: hooks, flags, parameters, buffers (read apart) and the children (each visited
as a module of its own)."""
SEEN_SHARDS = 1024
"""The ids of objects visited are kept in this many sets: growing one huge set rehashes it all at once (about 10 ms
at 500 000 ids), beyond a slice."""
_END = object()


@dataclass(frozen=True)
class Budget:
    """What one census may visit at most."""

    modules: int
    objects: int
    depth: int


@dataclass
class CensusResult:
    """What one census found: storages by owner, and how far it got."""

    found: dict[StorageKey, tuple[int, int]] = field(default_factory=dict)
    """Storage -> (index of its module in the map, bytes)."""
    parameters: set[StorageKey] = field(default_factory=set)
    """Storages of parameters (read for the baseline only) and of computed weights (``engine.modules.computed_weights``,
    read at every census: a legacy ``weight_norm`` writes a new one at every forward). Never discovered."""
    layers: dict[int, tuple[int, int]] = field(default_factory=dict)
    """``id`` of a cache layer object reached -> (index of the innermost module holding it, ``id`` of the cache
    object whose layers it is, or 0)."""
    modules: int = 0
    objects: int = 0
    exhausted: str | None = None
    unweighed: int = 0
    """Tensors with no storage of their own and no tensor inside them that could be weighed."""
    changed: int = 0
    """Dicts, sets and deques that changed size while they were walked (the rest of each was not read)."""
    longest_slice: float = 0.0
    """Seconds of the longest slice between two yields."""


def storage_key(tensor: torch.Tensor) -> tuple[StorageKey, int] | None:
    """``((device, data pointer), nbytes)`` of the storage behind ``tensor``; None for one without a storage."""
    found: dict[StorageKey, int] = {}
    if not safe.weigh(tensor, found) or len(found) != 1:
        return None
    ((key, size),) = found.items()
    return key, size


def census(
    modules: ModuleMap,
    budget: Budget,
    *,
    parameters: bool = False,
    slice_seconds: float = SLICE_SECONDS,
    layer_class: type | None = None,
    cache_class: type | None = None,
) -> Generator[None, None, CensusResult]:
    """Walk every module's tensors; yields between slices and returns the ``CensusResult``.

    ``layer_class`` and ``cache_class`` (``transformers``' ``CacheLayerMixin`` and ``Cache``): where instances
    of the first are reached, and which instance of the second holds them, go to ``CensusResult.layers``.
    """
    result = CensusResult()
    found = result.found
    shards: list[set[int]] = [set() for _ in range(SEEN_SHARDS)]
    kinds = safe._kinds
    roles: dict[type, int] = {}
    weighed: dict[StorageKey, int] = {}
    clock = time.perf_counter
    started = clock()
    countdown = CHECK_EVERY
    max_depth = budget.depth
    stack: list[list[Any]] = []
    names: Any
    attributes: Any
    frame: Any
    slots: Any
    entries = modules.modules
    for index in range(len(entries) - 1, -1, -1):
        module = entries[index][1]()
        if module is None:
            continue
        if result.modules >= budget.modules:
            result.exhausted = result.exhausted or "modules"
            break
        result.modules += 1
        attributes = MODULE_DICT.__get__(module, type(module))
        module = None
        if parameters:
            for tensor in _dict_values(attributes.get("_parameters")):
                if tensor is not None:
                    weighed.clear()
                    safe.weigh(tensor, weighed)
                    result.parameters.update(weighed)
            tensor = None
        computed: Any = ()
        hooks = attributes.get("_forward_pre_hooks")
        if type(hooks) is OrderedDict and hooks:
            computed = computed_weights(attributes)
            for name in computed:
                weighed.clear()
                safe.weigh(dict.get(attributes, name), weighed)
                result.parameters.update(weighed)
        buffers = attributes.get("_buffers")
        if type(buffers) is dict and buffers:
            stack.append([Kind.DICT, iter(dict.values(buffers)), 0, 1, 0])
        names = [name for name in list(attributes) if type(name) is str and name not in MODULE_ATTRIBUTES]
        if computed:
            names = [name for name in names if name not in computed]
        stack.append([None, (names, attributes), 0, 1, 0])
        attributes = buffers = hooks = None
        while stack:
            frame = stack[-1]
            how, source, position, depth, cache = frame
            value: Any = _END
            try:
                if how is None:
                    names, attributes = source
                    while position < len(names) and value is _END:
                        value = dict.get(attributes, names[position], _END)
                        position += 1
                    frame[2] = position
                elif how is Kind.LIST:
                    if position < list.__len__(source):
                        value = list.__getitem__(source, position)
                        frame[2] = position + 1
                elif how is Kind.TUPLE:
                    if position < tuple.__len__(source):
                        value = tuple.__getitem__(source, position)
                        frame[2] = position + 1
                else:
                    value = next(source, _END)
            except (RuntimeError, IndexError):
                result.changed += 1
                value = _END
            names = attributes = source = None
            if value is _END:
                stack.pop()
                frame = None
            else:
                cls = type(value)
                what = kinds.get(cls)
                if what is None:
                    what = safe.kind(cls)
                if what > Kind.SKIP:
                    if depth > max_depth:
                        result.exhausted = result.exhausted or "depth"
                    elif what is Kind.TENSOR:
                        result.objects += 1
                        weighed.clear()
                        if safe.weigh(value, weighed):
                            for key, size in weighed.items():
                                if key not in found:
                                    found[key] = (index, size)
                        elif id(value) not in (seen := shards[(id(value) >> 4) % SEEN_SHARDS]):
                            seen.add(id(value))
                            inner = safe.tensor_dict(value)
                            if inner:
                                stack.append([Kind.DICT, iter(dict.values(inner)), 0, depth + 1, cache])
                            else:
                                result.unweighed += 1
                            inner = None
                    elif id(value) not in (seen := shards[(id(value) >> 4) % SEEN_SHARDS]):
                        seen.add(id(value))
                        result.objects += 1
                        if what is Kind.LIST or what is Kind.TUPLE:
                            stack.append([what, value, 0, depth + 1, cache])
                        elif what is Kind.DICT:
                            stack.append([what, iter(dict.values(value)), 0, depth + 1, cache])
                        elif what is Kind.ITERABLE:
                            stack.append([what, safe.iterate(value), 0, depth + 1, cache])
                        else:
                            role = roles.get(cls)
                            if role is None:
                                chain = safe.mro(cls)
                                role = roles[cls] = (layer_class in chain) + 2 * (cache_class in chain)
                            if role & 1:
                                result.layers.setdefault(id(value), (index, cache))
                            inner_cache = id(value) if role & 2 else cache
                            slots = safe.slot_values(value)
                            if slots:
                                stack.append([Kind.TUPLE, slots, 0, depth + 1, inner_cache])
                            inner = safe.instance_dict(value)
                            if inner:
                                stack.append([Kind.DICT, iter(dict.values(inner)), 0, depth + 1, inner_cache])
                            inner = slots = None
                value = frame = None
                if result.objects >= budget.objects:
                    result.exhausted = result.exhausted or "objects"
                    stack.clear()
                    break
            countdown -= 1
            if not countdown:
                countdown = CHECK_EVERY
                if clock() - started >= slice_seconds:
                    started = yield from _end_slice(result, started)
        if result.objects >= budget.objects:
            break
        countdown -= 1
        if countdown <= 0:
            countdown = CHECK_EVERY
            if clock() - started >= slice_seconds:
                started = yield from _end_slice(result, started)
    for shard in shards:  # freeing hundreds of thousands of ids at once would be one long step
        shard.clear()
        if clock() - started >= slice_seconds:
            started = yield from _end_slice(result, started)
    return _finished(result, clock() - started)


def _dict_values(mapping: object) -> list[Any]:
    return list(dict.values(mapping)) if type(mapping) is dict else []


def _end_slice(result: CensusResult, started: float) -> Generator[None, None, float]:
    """Record the slice that began at ``started``, yield the interpreter, and return when the next slice begins."""
    result.longest_slice = max(result.longest_slice, time.perf_counter() - started)
    yield
    return time.perf_counter()


def _finished(result: CensusResult, last_slice: float) -> CensusResult:
    result.longest_slice = max(result.longest_slice, last_slice)
    return result


def run(walk: Generator[None, None, CensusResult], pause: bool = True) -> CensusResult:
    """Drive a census to its end, handing the interpreter to other threads between slices when ``pause``."""
    while True:
        try:
            next(walk)
        except StopIteration as done:
            result: CensusResult = done.value
            return result
        if pause:
            time.sleep(0)
