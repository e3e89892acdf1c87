"""The census: every tensor storage reachable from the model's modules, walked in slices.

From each module it follows the attributes the module's own code set (``nn.Module``'s
bookkeeping is skipped), its buffers, and the containers (dicts, lists, tuples, deques, sets),
callables (a function's closure cells, default arguments and attributes, a bound method's object and
function, a ``functools.partial``'s function, arguments and keywords), exceptions (their ``args``)
and plain objects (their ``__dict__`` and ``__slots__``) they hold, to a bounded depth. Parameters
are read only for the baseline; computed weights (the attribute a legacy ``weight_norm`` or
``spectral_norm`` rewrites before every forward) are read with them, at every census, and never
followed as attributes. Modules are visited innermost first (every module before the modules that
contain it), so a storage or a container reachable from several modules belongs to the innermost
one that holds it.

It runs none of the model's code (``safe``): no property, ``__getattr__``, ``__class__``,
``__iter__``, ``get`` or ``__torch_function__`` of the objects it reads; a dict, the instance
``__dict__`` of a module included, is read through ``dict``'s own C methods whatever its class.

Holders it does not look into are named and counted (``CensusResult.skipped``, ``SKIPPED_HOLDERS``).

``census`` is a generator: it yields whenever a slice has run for ``slice_seconds``, so that the
thread driving it can hand the interpreter back (``run`` sleeps 0 between slices). Every step of a
slice is bounded: a container is walked item by item (a list by index, a dict or a set through its
built-in iterator), resumed across slices, never copied; a dict or set that changes size while it is
walked is left where it is (``CensusResult.changed``). Between slices it holds no tensor: a tensor is
weighed when it is reached, and only the containers on the current path are held.

What it keeps is ints in small tables (``shards``), never a tuple, list or dict per object: the
collector counts only the objects it tracks, so a census of any size sets off no collection of its
own, and no table it grows rehashes more than a few thousand entries at once. It keeps:

- per new storage (not in ``known``, the baseline), its id and its packed module and size;
- per container or object held from more than one place (``sys.getrefcount``), its id, so that it is
  walked once (a container held once cannot be met twice);
- per module, its bytes and storages found.

Each is bounded by the budget (``Budget.objects``, ``Budget.modules``): ``peak_bytes`` states the most.
"""

from __future__ import annotations

import functools
import sys
import time
import types
from collections import OrderedDict
from collections.abc import Container, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from modelkv_exporter.engine import tensors
from modelkv_exporter.engine.discover import safe
from modelkv_exporter.engine.discover.module_map import ModuleMap
from modelkv_exporter.engine.discover.safe import Kind
from modelkv_exporter.engine.discover.shards import Shards
from modelkv_exporter.engine.module_walk import MODULE_DICT, computed_weights
from modelkv_exporter.engine.observe.layers import StorageKey

SLICE_SECONDS = 0.0005
"""How long one slice runs before it yields: half a millisecond, leaving room for the steps until the next look
at the clock and for the thread being interrupted (a slice stays under 1 ms of CPU)."""
CHECK_EVERY = 8
"""Steps (items read, tensors weighed) between two looks at the clock."""

MODULE_ATTRIBUTES = frozenset(torch.nn.Module().__dict__)
"""``nn.Module``'s own attributes: hooks, flags, parameters, buffers (read apart) and the children (each visited
as a module of its own)."""
RESTARTS = 3
"""Times a module's own attributes are read again from the start when they change while they are read."""
INDEX_BITS = 32
"""A found storage's size and module index are packed in one int: ``size << INDEX_BITS | index``."""
BYTES_PER_ENTRY = 200
"""The most one entry of the census's tables costs, as ``tracemalloc`` measures it (181 bytes a new storage over
200 000 of them, tests/engine/test_hostile_census.py): an int key and an int value (up to 36 bytes each) and its
share of a dict's table at its emptiest (just after a growth)."""
BYTES_PER_MODULE = 2 * 8 + 2 * 36
"""Per module of the map: its slots in the two lists of bytes and storages found, and their ints."""

SKIPPED_HOLDERS: dict[str, str] = {
    "lru_cache": "a functools.lru_cache's cached results (reading them calls the cache)",
    "generator": "a generator's or coroutine's suspended frame",
    "mappingproxy": "a mappingproxy (a class's __dict__ or a read-only view)",
    "module_outside_the_model": "a module that is not in the model's module tree (held in a plain list, say)",
    "module_added_after_load": "a submodule added to the model after load",
    "tensor_dict_key": "a tensor used as a dict key",
}
"""The holders the census meets and does not look into, by the name ``CensusResult.skipped`` counts them under."""
_SKIPPED_BY_TYPE: dict[type, str] = {
    functools._lru_cache_wrapper: "lru_cache",  # type: ignore[attr-defined]
    types.GeneratorType: "generator",
    types.CoroutineType: "generator",
    types.AsyncGeneratorType: "generator",
    types.MappingProxyType: "mappingproxy",
}

_END = object()
_PAIR_END = (_END, _END)
_ATTRIBUTES = object()
"""A frame over a module's own ``__dict__`` (its attributes, not ``nn.Module``'s)."""
_CHILDREN = object()
"""A frame over a module's ``_modules`` (checked against the module map, not walked)."""
_DICT = Kind.DICT
_LIST = Kind.LIST
_TUPLE = Kind.TUPLE
_TENSOR = Kind.TENSOR
_SKIP = Kind.SKIP
_ROLE_LAYER, _ROLE_CACHE, _ROLE_EXCEPTION, _ROLE_LRU = 1, 2, 4, 8
_devices: dict[str, int] = {"cpu": 0}


def _references_when_held_once() -> int:
    """What ``sys.getrefcount`` says of an object one container holds, read into a local as the census reads it."""
    holder = [object()]
    value = list.__getitem__(holder, 0)
    return sys.getrefcount(value)


def _references_when_held_once_in_a_dict() -> int:
    """The same for a dict's value read through its items iterator (which keeps its last pair for reuse)."""
    holder = {0: object()}
    items = iter(dict.items(holder))
    key, value = next(items, _PAIR_END)
    return sys.getrefcount(value)


HELD_ONCE = _references_when_held_once()
HELD_ONCE_IN_DICT = _references_when_held_once_in_a_dict()
"""``sys.getrefcount`` of an item held by its container alone while the census looks at it: a container with no
more references than this cannot be reached again, and is not remembered."""


@dataclass(frozen=True)
class Budget:
    """What one census may visit at most."""

    modules: int
    objects: int
    depth: int


def peak_bytes(budget: Budget) -> int:
    """The most memory a census under ``budget`` keeps at once, beyond its fixed tables: its three tables (new
    storages, objects held from several places, cache layers) together hold at most one entry per object visited,
    and its per-module figures one slot per module."""
    return budget.objects * BYTES_PER_ENTRY + budget.modules * BYTES_PER_MODULE


def storage_id(key: StorageKey) -> int:
    """One int for a storage's ``(device, data pointer)``: the device numbered in order of first sight, the
    pointer (negative for a storage without memory) shifted to stay apart from every other device's."""
    device, pointer = key
    code = _devices.get(device)
    if code is None:
        code = _devices.setdefault(device, len(_devices))
    return (code << 65) + pointer + (1 << 63)


def storage_ids(keys: Iterable[StorageKey]) -> set[int]:
    """``storage_id`` of each key."""
    return {storage_id(key) for key in keys}


class Scratch:
    """The tables a census fills, made once for a budget and reused by every census that is given them."""

    __slots__ = ("found", "seen", "layers")

    def __init__(self, budget: Budget) -> None:
        self.found = Shards(budget.objects)
        """New storage id -> ``size << INDEX_BITS | module index``."""
        self.seen = Shards(budget.objects)
        """``id`` of a container or object held from several places and visited -> 0."""
        self.layers = Shards(budget.objects)
        """``id`` of a cache layer reached -> ``cache id << INDEX_BITS | module index``."""


@dataclass
class CensusResult:
    """What one census found: storages by owner, and how far it got."""

    found: Shards
    """New storages (not in the census's ``known``): storage id (``storage_id``) -> ``size << INDEX_BITS | index``
    of its module in the map. Read with ``storages``."""
    layers: Shards
    """``id`` of a cache layer object reached -> ``cache id << INDEX_BITS | index`` of the innermost module holding
    it (the cache object whose layers it is, 0: none). Read with ``placed``."""
    sizes: list[int]
    """Bytes of new storages by module index."""
    counts: list[int]
    """New storages by module index."""
    owners: list[int] = field(default_factory=list)
    """The module indices with new storages, in the order first found."""
    parameters: set[int] = field(default_factory=set)
    """Storage ids of parameters (read for the baseline only) and of computed weights
    (``engine.module_walk.computed_weights``, read at every census: a legacy ``weight_norm`` writes a new one at every
    forward). Never discovered."""
    modules: int = 0
    objects: int = 0
    exhausted: str | None = None
    unweighed: int = 0
    """Tensors with no storage of their own and no tensor inside them that could be weighed."""
    changed: int = 0
    """Dicts, sets and deques that changed size while they were walked (the rest of each was not read)."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Holders met and not looked into, by kind (``SKIPPED_HOLDERS``)."""
    longest_slice: float = 0.0
    """Seconds of the longest slice between two yields."""

    def storages(self) -> dict[int, tuple[int, int]]:
        """Every new storage: its id -> (index of its module, bytes)."""
        mask = (1 << INDEX_BITS) - 1
        return {key: (packed & mask, packed >> INDEX_BITS) for key, packed in self.found.items()}

    def placed(self, layer: int) -> tuple[int, int] | None:
        """For the ``id`` of a cache layer reached: (index of the innermost module holding it, ``id`` of its cache
        or 0); None when not reached."""
        packed = self.layers.get(layer)
        return None if packed is None else (packed & ((1 << INDEX_BITS) - 1), packed >> INDEX_BITS)

    def leave_out(self, storages: Iterable[int]) -> None:
        """Take these storage ids out of what was found (storages known only once the walk is over)."""
        found = self.found
        for key in storages:
            packed = found.pop(key)
            if packed is not None:
                index = packed & ((1 << INDEX_BITS) - 1)
                self.sizes[index] -= packed >> INDEX_BITS
                self.counts[index] -= 1

    def by_owner(self) -> Iterator[tuple[int, int, int]]:
        """``(module index, bytes, storages)`` of every module with new storages."""
        for index in self.owners:
            if self.counts[index]:
                yield index, self.sizes[index], self.counts[index]


def census(
    modules: ModuleMap,
    budget: Budget,
    *,
    parameters: bool = False,
    known: Container[int] = frozenset(),
    slice_seconds: float = SLICE_SECONDS,
    layer_class: type | None = None,
    cache_class: type | None = None,
    scratch: Scratch | None = None,
) -> Generator[None, None, CensusResult]:
    """Walk every module's tensors; yields between slices and returns the ``CensusResult``.

    Storages whose id is in ``known`` (the baseline) are passed over. ``layer_class`` and ``cache_class``
    (``transformers``' ``CacheLayerMixin`` and ``Cache``): where instances of the first are reached, and which
    instance of the second holds them, go to ``CensusResult.layers``. ``scratch``: tables to fill (emptied first),
    reused from census to census; new ones otherwise.
    """
    walk = _Walk(modules, budget, parameters, known, slice_seconds, layer_class, cache_class, scratch)
    return (yield from walk.run())


def release(result: CensusResult, slice_seconds: float = SLICE_SECONDS) -> Generator[None, None, None]:
    """Empty a result's tables in slices (freeing hundreds of thousands of entries at once would be one long step)."""
    for table in (result.found, result.layers):
        yield from _clear(table, slice_seconds)


def _clear(table: Shards, slice_seconds: float) -> Generator[None, None, None]:
    started = time.perf_counter()
    for part in table.parts:
        part.clear()
        if time.perf_counter() - started >= slice_seconds:
            yield
            started = time.perf_counter()


class _Walk:
    """One census: the frames of the walk in preallocated parallel lists, and the steps that fill its tables."""

    def __init__(
        self,
        modules: ModuleMap,
        budget: Budget,
        parameters: bool,
        known: Container[int],
        slice_seconds: float,
        layer_class: type | None,
        cache_class: type | None,
        scratch: Scratch | None,
    ) -> None:
        scratch = scratch or Scratch(budget)
        for table in (scratch.found, scratch.seen, scratch.layers):
            for part in table.parts:
                part.clear()
        self.map = modules
        self.budget = budget
        self.read_parameters = parameters
        self.known = known
        self.slice_seconds = slice_seconds
        self.layer_class = layer_class
        self.cache_class = cache_class
        self.seen = scratch.seen
        count = len(modules.modules)
        self.result = CensusResult(found=scratch.found, layers=scratch.layers, sizes=[0] * count, counts=[0] * count)
        self.weighed: dict[StorageKey, int] = {}
        self.roles: dict[type, int] = {}
        self.skipped_names: dict[type, str | None] = {}
        self.computed: Container[str] = ()
        self.attributes: dict[str, Any] | None = None
        """The ``__dict__`` of the module being walked (read again from the start when it changes size)."""
        self.restarts = 0
        height = 3 * (budget.depth + 2) + 4
        """Frames at most: a module pushes three (children, buffers, attributes), an object three a level (slots,
        ``__dict__``, an exception's ``args``), and nothing is pushed past ``depth``."""
        self.hows: list[Any] = [None] * height
        self.sources: list[Any] = [None] * height
        self.positions = [0] * height
        self.depths = [0] * height
        self.caches = [0] * height
        self.top = 0
        self.started = 0.0

    # -- the driver -----------------------------------------------------------------------------------

    def run(self) -> Generator[None, None, CensusResult]:
        result = self.result
        clock = time.perf_counter
        self.started = clock()
        entries = self.map.modules
        for index in range(len(entries) - 1, -1, -1):
            if result.objects >= self.budget.objects:
                break
            module = entries[index][1]()
            if module is None:
                continue
            if result.modules >= self.budget.modules:
                result.exhausted = result.exhausted or "modules"
                break
            self._begin_module(module, index)
            module = None
            yield from self._walk_frames(index)
            self.attributes = None
            if clock() - self.started >= self.slice_seconds:
                yield from self._end_slice()
        yield from self._forget_seen()
        result.longest_slice = max(result.longest_slice, clock() - self.started)
        return result

    def _end_slice(self) -> Generator[None, None, None]:
        """Record the slice that is ending, yield the interpreter, and start the next slice when resumed."""
        self.result.longest_slice = max(self.result.longest_slice, time.perf_counter() - self.started)
        yield
        self.started = time.perf_counter()

    def _forget_seen(self) -> Generator[None, None, None]:
        for part in self.seen.parts:
            part.clear()
            if time.perf_counter() - self.started >= self.slice_seconds:
                yield from self._end_slice()

    # -- a module -------------------------------------------------------------------------------------

    def _begin_module(self, module: torch.nn.Module, index: int) -> None:
        """Count the module, read its parameters (for the baseline) and computed weights, and push its frames: its
        children (checked against the map), its buffers, its own attributes."""
        result = self.result
        result.modules += 1
        attributes = MODULE_DICT.__get__(module, type(module))
        if dict not in safe.mro(type(attributes)):
            return
        if self.read_parameters:
            self._add_parameters(dict.get(attributes, "_parameters"))
        hooks = dict.get(attributes, "_forward_pre_hooks")
        self.computed = ()
        if type(hooks) is OrderedDict and hooks:
            self.computed = frozenset(computed_weights(attributes))
            for name in self.computed:
                self.weighed.clear()
                tensors.weigh(dict.get(attributes, name), self.weighed)
                result.parameters.update(storage_ids(self.weighed))
        children = dict.get(attributes, "_modules")
        if type(children) is dict and children:
            self._push(_CHILDREN, iter(dict.values(children)), 1, 0)
        buffers = dict.get(attributes, "_buffers")
        if type(buffers) is dict and buffers:
            self._push(_DICT, iter(dict.items(buffers)), 1, 0)
        self._push(_ATTRIBUTES, iter(dict.items(attributes)), 1, 0)
        self.attributes = attributes
        self.restarts = 0

    def _add_parameters(self, parameters: object) -> None:
        if type(parameters) is not dict:
            return
        for tensor in list(dict.values(parameters)):
            if tensor is not None:
                self.weighed.clear()
                tensors.weigh(tensor, self.weighed)
                self.result.parameters.update(storage_ids(self.weighed))

    def _push(self, how: Any, source: Any, depth: int, cache: int) -> None:
        top = self.top
        self.hows[top] = how
        self.sources[top] = source
        self.positions[top] = 0
        self.depths[top] = depth
        self.caches[top] = cache
        self.top = top + 1

    # -- the walk -------------------------------------------------------------------------------------

    def _walk_frames(self, index: int) -> Generator[None, None, None]:
        """Read the frames on the stack item by item, weighing tensors and pushing what holds more, until the
        stack is empty; yields when a slice has run its time."""
        result = self.result
        hows, sources, positions, depths = self.hows, self.sources, self.positions, self.depths
        kinds = safe._kinds
        max_depth = self.budget.depth
        most_objects = self.budget.objects
        slice_seconds = self.slice_seconds
        clock = time.perf_counter
        countdown = CHECK_EVERY
        key: Any
        value: Any
        while self.top:
            frame = self.top - 1
            how = hows[frame]
            source = sources[frame]
            value = _END
            try:
                if how is _LIST:
                    position = positions[frame]
                    if position < list.__len__(source):
                        value = list.__getitem__(source, position)
                        positions[frame] = position + 1
                elif how is _TUPLE:
                    position = positions[frame]
                    if position < tuple.__len__(source):
                        value = tuple.__getitem__(source, position)
                        positions[frame] = position + 1
                elif how is _DICT:
                    key, value = next(source, _PAIR_END)
                    if type(key) is not str and safe.kind(type(key)) is _TENSOR:
                        self._skip("tensor_dict_key")
                elif how is _ATTRIBUTES:
                    key, value = next(source, _PAIR_END)
                    if key is not _END and (type(key) is not str or key in MODULE_ATTRIBUTES or key in self.computed):
                        value = None
                elif how is _CHILDREN:
                    value = next(source, _END)
                    if value is not _END:
                        self._check_child(value)
                        value = None
                else:
                    value = next(source, _END)
            except (RuntimeError, IndexError):
                value = self._changed(how, frame)
            source = key = None
            if value is _END:
                self.top = frame
                hows[frame] = sources[frame] = None
            else:
                cls = type(value)
                what = kinds.get(cls)
                if what is None:
                    what = safe.kind(cls)
                if what > _SKIP:
                    depth = depths[frame]
                    held_once = HELD_ONCE_IN_DICT if how is _DICT or how is _ATTRIBUTES else HELD_ONCE
                    if depth > max_depth:
                        result.exhausted = result.exhausted or "depth"
                    elif what is _TENSOR:
                        result.objects += 1
                        if not self._weigh(value, index) and self._first_visit(value, held_once + 1):
                            self._enter_wrapper(value, depth + 1, self.caches[frame])
                    elif self._first_visit(value, held_once + 1):
                        result.objects += 1
                        self._enter(value, cls, what, index, depth + 1, self.caches[frame])
                elif what is _SKIP:
                    self._skipped_holder(value, cls)
                value = None
                if result.objects >= most_objects:
                    result.exhausted = result.exhausted or "objects"
                    self._drop_frames()
                    return
            countdown -= 1
            if not countdown:
                countdown = CHECK_EVERY
                if clock() - self.started >= slice_seconds:
                    yield from self._end_slice()

    def _changed(self, how: Any, frame: int) -> Any:
        """A container changed size while it was walked: a module's own attributes are read again from the start
        (``RESTARTS`` times at most: what was found already is not found twice); anything else is left where it is."""
        if how is _ATTRIBUTES and self.restarts < RESTARTS and self.attributes is not None:
            self.restarts += 1
            self.sources[frame] = iter(dict.items(self.attributes))
            return None
        self.result.changed += 1
        return _END

    def _drop_frames(self) -> None:
        for frame in range(self.top):
            self.hows[frame] = self.sources[frame] = None
        self.top = 0

    def _first_visit(self, value: Any, held_once: int) -> bool:
        """Whether ``value`` is met for the first time in this census. Only what is held from more than one place
        (``held_once``: the references it has when one container holds it, here) can be met again, and only that is
        remembered."""
        if sys.getrefcount(value) <= held_once:
            return True
        ident = id(value)
        part = self.seen.part(ident)
        if ident in part:
            return False
        part[ident] = 0
        return True

    def _weigh(self, tensor: Any, index: int) -> bool:
        """Record the storages behind a tensor at module ``index``, unless known or found already at a module
        further in; False for a wrapper subclass, which has no storage of its own."""
        weighed = self.weighed
        weighed.clear()
        if not tensors.weigh(tensor, weighed):
            return False
        result = self.result
        known = self.known
        parameters = result.parameters
        found = result.found
        for key in weighed:
            storage = storage_id(key)
            if storage in known or storage in parameters:
                continue
            part = found.part(storage)
            if storage in part:
                continue
            size = weighed[key]
            part[storage] = size << INDEX_BITS | index
            if not result.counts[index]:
                result.owners.append(index)
            result.sizes[index] += size
            result.counts[index] += 1
        return True

    def _enter_wrapper(self, tensor: Any, depth: int, cache: int) -> None:
        """A wrapper subclass's inner tensors, from its ``__dict__``; counted as unweighed when it has none."""
        inner = tensors.tensor_dict(tensor)
        if inner:
            self._push(_DICT, iter(dict.items(inner)), depth, cache)
        else:
            self.result.unweighed += 1

    def _enter(self, value: Any, cls: type, what: Kind, index: int, depth: int, cache: int) -> None:
        """Push the frames that read what ``value`` holds (its items at ``depth``)."""
        if what is _LIST or what is _TUPLE:
            self._push(what, value, depth, cache)
        elif what is _DICT:
            self._push(_DICT, iter(dict.items(value)), depth, cache)
        elif what is Kind.ITERABLE:
            self._push(Kind.ITERABLE, safe.iterate(value), depth, cache)
        elif what is Kind.CALLABLE:
            parts = safe.callable_parts(value)
            if parts:
                self._push(_TUPLE, parts, depth, cache)
        else:
            self._enter_object(value, cls, index, depth, cache)

    def _enter_object(self, value: Any, cls: type, index: int, depth: int, cache: int) -> None:
        role = self.roles.get(cls)
        if role is None:
            role = self.roles[cls] = self._role(cls)
        if role & _ROLE_LAYER:
            layers = self.result.layers.part(id(value))
            if id(value) not in layers:
                layers[id(value)] = cache << INDEX_BITS | index
        if role & _ROLE_LRU:
            self._skip("lru_cache")
        inner_cache = id(value) if role & _ROLE_CACHE else cache
        slots = safe.slot_values(value)
        if slots:
            self._push(_TUPLE, slots, depth, inner_cache)
        if role & _ROLE_EXCEPTION:
            arguments = safe.exception_args(value)
            if arguments:
                self._push(_TUPLE, arguments, depth, inner_cache)
        inner = safe.raw_instance_dict(value)
        if inner is not None and dict.__len__(inner):
            self._push(_DICT, iter(dict.items(inner)), depth, inner_cache)

    def _role(self, cls: type) -> int:
        chain = safe.mro(cls)
        role = 0
        if self.layer_class is not None and self.layer_class in chain:
            role |= _ROLE_LAYER
        if self.cache_class is not None and self.cache_class in chain:
            role |= _ROLE_CACHE
        if BaseException in chain:
            role |= _ROLE_EXCEPTION
        if functools._lru_cache_wrapper in chain:  # type: ignore[attr-defined]
            role |= _ROLE_LRU
        return role

    # -- what is not looked into ----------------------------------------------------------------------

    def _skip(self, name: str) -> None:
        skipped = self.result.skipped
        skipped[name] = skipped.get(name, 0) + 1

    def _skipped_holder(self, value: Any, cls: type) -> None:
        """Count a holder of a kind the census does not look into (a module outside the map among them)."""
        name = self.skipped_names.get(cls, _END)
        if name is _END:
            name = self.skipped_names[cls] = _skipped_name(cls)
        if name == "module_outside_the_model":
            if self.map.path_of(value) is None:
                self._skip("module_outside_the_model")
        elif name is not None:
            self._skip(name)  # type: ignore[arg-type]

    def _check_child(self, child: object) -> None:
        """A child in a module's ``_modules`` that the map does not have was added after load."""
        if child is not None and torch.nn.Module in safe.mro(type(child)) and self.map.path_of(child) is None:
            self._skip("module_added_after_load")


def _skipped_name(cls: type) -> str | None:
    chain = safe.mro(cls)
    if torch.nn.Module in chain:
        return "module_outside_the_model"
    for klass in chain:
        name = _SKIPPED_BY_TYPE.get(klass)
        if name is not None:
            return name
    return None


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


def finish(walk: Generator[None, None, None], pause: bool = True) -> None:
    """Drive a ``release`` (or any walk that returns nothing) to its end, as ``run`` does."""
    for _ in walk:
        if pause:
            time.sleep(0)
