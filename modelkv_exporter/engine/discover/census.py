"""The census: every tensor storage reachable from the model's modules, walked in slices.

From each module it follows the attributes the module's own code set (``nn.Module``'s
bookkeeping is skipped), its buffers, and the containers (dicts, lists, tuples, deques) and
plain objects they hold, to a bounded depth. Parameters are read only for the baseline. A
storage reachable from several modules belongs to the innermost one that holds it.

``census`` is a generator: it yields whenever a slice has run for ``slice_seconds``, so that the
thread driving it can hand the interpreter back (``run`` sleeps 0 between slices). The dictionaries
it reads are copied in one call each (atomic under the GIL), so a model thread changing them
between slices is never seen half-way.
"""

from __future__ import annotations

import collections
import functools
import time
import types
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import torch

from modelkv_exporter.engine.discover.modules import ModuleMap
from modelkv_exporter.engine.observe.layers import StorageKey

SLICE_SECONDS = 0.0005
"""How long one slice runs before it yields: half a millisecond, leaving room for the objects until the next look
at the clock and for the thread being interrupted (a slice stays under 1 ms of CPU)."""
CHECK_EVERY = 8
"""Objects between two looks at the clock."""

MODULE_ATTRIBUTES = frozenset(torch.nn.Module().__dict__)
"""``nn.Module``'s own attributes: hooks, flags, parameters, buffers (read apart) and the children (each visited
as a module of its own)."""
ATOMIC: frozenset[type] = frozenset(
    {int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device, torch.Size, range, slice}
)
"""Types that never hold a tensor."""
NOT_WALKED: tuple[type, ...] = (
    type,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
    functools.partial,
    torch.nn.Module,
)
"""Objects the census does not look into: code, classes, and modules (each module is visited on its own)."""
SEQUENCES = (list, tuple, collections.deque)


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
    """Storages of parameters (read for the baseline only)."""
    modules: int = 0
    objects: int = 0
    exhausted: str | None = None
    longest_slice: float = 0.0
    """Seconds of the longest slice between two yields."""


def storage_key(tensor: torch.Tensor) -> tuple[StorageKey, int] | None:
    """``((device, data pointer), nbytes)`` of the storage behind ``tensor``; None for one without a storage."""
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    pointer = storage.data_ptr()
    return (str(storage.device), pointer if pointer else -id(tensor)), int(storage.nbytes())


def _is_descendant(path: str, of: str) -> bool:
    return path != of and (of == "" or path.startswith(of + "."))


def census(
    modules: ModuleMap, budget: Budget, *, parameters: bool = False, slice_seconds: float = SLICE_SECONDS
) -> Generator[None, None, CensusResult]:
    """Walk every module's tensors; yields between slices and returns the ``CensusResult``."""
    result = CensusResult()
    found = result.found
    paths = [path for path, _ in modules.modules]
    seen: set[int] = set()
    clock = time.perf_counter
    started = clock()
    countdown = CHECK_EVERY
    max_depth = budget.depth
    stack: list[tuple[Any, int]] = []
    for index, (path, reference) in enumerate(modules.modules):
        module = reference()
        if module is None:
            continue
        if result.modules >= budget.modules:
            result.exhausted = result.exhausted or "modules"
            break
        result.modules += 1
        attributes = module.__dict__
        if parameters:
            for tensor in list(module._parameters.values()):
                known = None if tensor is None else storage_key(tensor)
                if known is not None:
                    result.parameters.add(known[0])
        buffers = module._buffers
        if buffers:
            stack.extend((tensor, 1) for tensor in list(buffers.values()) if tensor is not None)
        for key in attributes.keys() - MODULE_ATTRIBUTES:
            value = attributes.get(key)
            if type(value) not in ATOMIC:
                stack.append((value, 1))
        while stack:
            value, depth = stack.pop()
            if isinstance(value, torch.Tensor):
                result.objects += 1
                known = storage_key(value)
                if known is not None:
                    storage, size = known
                    holder = found.get(storage)
                    if holder is None or (holder[0] != index and _is_descendant(path, paths[holder[0]])):
                        found[storage] = (index, size)
            else:
                if id(value) in seen or isinstance(value, NOT_WALKED):
                    continue
                if isinstance(value, dict):
                    items = list(value.values())
                elif isinstance(value, SEQUENCES):
                    items = list(value)
                else:
                    try:
                        attributes = value.__dict__
                    except Exception:
                        continue
                    if not isinstance(attributes, dict):
                        continue
                    items = list(attributes.values())
                seen.add(id(value))
                result.objects += 1
                children = [item for item in items if type(item) not in ATOMIC]
                if children:
                    if depth >= max_depth:
                        result.exhausted = result.exhausted or "depth"
                    else:
                        stack.extend((child, depth + 1) for child in children)
            if result.objects >= budget.objects:
                result.exhausted = result.exhausted or "objects"
                stack.clear()
                return _finished(result, clock() - started)
            countdown -= 1
            if not countdown:
                countdown = CHECK_EVERY
                if clock() - started >= slice_seconds:
                    started = yield from _end_slice(result, started)
        countdown -= 1
        if countdown <= 0:
            countdown = CHECK_EVERY
            if clock() - started >= slice_seconds:
                started = yield from _end_slice(result, started)
    return _finished(result, clock() - started)


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
