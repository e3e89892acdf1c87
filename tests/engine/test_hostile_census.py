"""The census in a hostile process (issue 46): it sets off no collection of its own, keeps a bounded and stated
amount of memory, reads a dict-subclass ``__dict__`` without running its methods, reaches what closures, default
arguments, ``functools.partial``, bound methods and exceptions hold, and names the holders it does not look into.

Each test failed on the tree before issue 46 (2e7b210): its census kept two tuples per storage found (about 4 000
collections and 300 MB over a million small tensors), called a module ``__dict__``'s ``get`` and ``__iter__``
(discovery went off when ``__iter__`` raised), skipped functions, methods and partials, and said nothing of what
it skipped.
"""

from __future__ import annotations

import collections
import functools
import gc
import tracemalloc
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from modelkv_exporter.contract.snapshot import DiscoveryStatus
from modelkv_exporter.engine.config import DiscoverySettings
from modelkv_exporter.engine.discover import Discovery, census
from modelkv_exporter.engine.discover.module_map import ModuleMap
from modelkv_exporter.engine.observe import Observer
from tests.engine.test_discovery import EVERYTHING

MANY = 200_000
"""Small tensors (or one-element lists) one module holds: enough that two tuples kept for each set off hundreds of
collections and tens of MB."""
BUDGET = census.Budget(modules=1000, objects=1_000_000, depth=8)
MANY_OBJECTS = DiscoverySettings(census_interval=0, discover_floor_bytes=0, census_max_objects=1_000_000)
CALLS: collections.Counter[str] = collections.Counter()


class Collections:
    """Collections the collector starts while it is installed (``gc.callbacks``): a count, not a time."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.count += 1

    def __enter__(self) -> Collections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def peak_of(body: Callable[[], Any]) -> int:
    """The most memory (``tracemalloc``) allocated at once while ``body`` runs, beyond what was there before."""
    gc.collect()
    tracemalloc.start()
    try:
        body()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def started(root: nn.Module, observer: Observer, settings: Any = EVERYTHING) -> Discovery:
    found = Discovery(root, settings, observer=observer)
    assert found.enabled, found.reason
    found.start()
    return found


def status_of(found: Discovery) -> tuple[dict[str, int], DiscoveryStatus]:
    published, status = found.beat()
    assert status.enabled, status.reason
    return {owner.owner: owner.live_bytes for owner in published if owner.found_by == "census"}, status


# -- the collector does not notice it -------------------------------------------------------------------


@pytest.fixture
def many_tensors(observer: Observer) -> Iterator[tuple[nn.Module, Discovery]]:
    root = nn.Module()
    root.many = [torch.zeros(1) for _ in range(MANY)]
    found = started(root, observer, MANY_OBJECTS)
    try:
        yield root, found
    finally:
        found.uninstall()


def test_a_census_over_many_small_tensors_sets_off_no_collection_of_its_own(many_tensors) -> None:
    _, found = many_tensors
    gc.collect()
    with Collections() as collections:
        found.census()
    assert found.last is not None and found.last.objects > MANY
    assert collections.count <= 5, f"{collections.count} collections in one census (2e7b210: 572)"


def test_a_census_keeps_nothing_per_known_storage(many_tensors) -> None:
    _, found = many_tensors
    peak = peak_of(found.census)
    assert peak < 1_000_000, f"{peak} bytes at most while walking {MANY} tensors it knew already"


def test_a_census_keeps_at_most_its_stated_bytes_per_new_storage(observer: Observer) -> None:
    root = nn.Module()
    found = started(root, observer, MANY_OBJECTS)
    root.many = [torch.zeros(1) for _ in range(MANY)]
    try:
        peak = peak_of(found.census)
        live, _ = status_of(found)
    finally:
        found.uninstall()
    assert live[""] == MANY * 4
    stated = census.peak_bytes(census.Budget(modules=1, objects=MANY, depth=8))
    assert peak <= stated, f"{peak} bytes at most, stated {stated}"


def test_no_table_of_the_census_grows_past_a_few_thousand_entries_at_once() -> None:
    root = nn.Module()
    root.many = [torch.zeros(1) for _ in range(MANY)]
    result = census.run(census.census(ModuleMap(root), BUDGET), pause=False)
    assert len(result.found) == MANY
    assert result.found.largest() <= 4096, "one growth of this table would rehash it all in one step"


def test_containers_held_once_are_not_remembered_shared_ones_are_walked_once() -> None:
    root = nn.Module()
    root.lists = [[item] for item in range(MANY)]
    peak = peak_of(lambda: census.run(census.census(ModuleMap(root), BUDGET), pause=False))
    assert peak < 1_000_000, f"{peak} bytes at most for {MANY} lists held once each"
    shared = [torch.zeros(3)]
    cycle: list[Any] = [torch.zeros(5)]
    cycle.append(cycle)
    root.lists = [shared, shared, cycle]
    result = census.run(census.census(ModuleMap(root), BUDGET), pause=False)
    assert result.objects == 1 + 1 + 1 + 1 + 1, (
        "the outer list, the shared list and its tensor, the cycle and its tensor"
    )


def test_breaking_the_held_once_rule_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    root = nn.Module()
    root.lists = [[item] for item in range(MANY)]
    monkeypatch.setattr(census, "HELD_ONCE", -10)
    monkeypatch.setattr(census, "HELD_ONCE_IN_DICT", -10)
    peak = peak_of(lambda: census.run(census.census(ModuleMap(root), BUDGET), pause=False))
    assert peak > 2_000_000, "remembering every list would cost memory per list"


# -- a dict subclass as __dict__ --------------------------------------------------------------------------


class RecordingDict(dict):  # type: ignore[type-arg]
    """A ``__dict__`` whose every method records its call, and whose ``__iter__`` raises."""

    def get(self, *args: Any) -> Any:
        CALLS["get"] += 1
        return super().get(*args)

    def __iter__(self) -> Iterator[Any]:
        CALLS["__iter__"] += 1
        raise RuntimeError("the model's own __iter__")

    def items(self) -> Any:
        CALLS["items"] += 1
        return super().items()

    def values(self) -> Any:
        CALLS["values"] += 1
        return super().values()

    def keys(self) -> Any:
        CALLS["keys"] += 1
        return super().keys()

    def __getitem__(self, key: Any) -> Any:
        CALLS["__getitem__"] += 1
        return super().__getitem__(key)

    def __len__(self) -> int:
        CALLS["__len__"] += 1
        return super().__len__()


class Plain:
    pass


def test_a_dict_subclass_dict_is_read_without_its_methods_and_discovery_stays_on(observer: Observer) -> None:
    root = nn.Module()
    child = nn.Module()
    child.inner = nn.Linear(2, 2)
    holder = Plain()
    holder.__dict__ = RecordingDict()
    child.holder = holder
    child.__dict__ = RecordingDict(dict.items(child.__dict__))
    root.child = child
    CALLS.clear()
    found = started(root, observer)
    try:
        dict.__setitem__(child.__dict__, "kv", torch.zeros(16))
        dict.__setitem__(holder.__dict__, "kv", torch.zeros(32))
        live, status = status_of(found)
    finally:
        found.uninstall()
    assert dict(CALLS) == {}
    assert found.enabled and status.enabled
    assert live["child"] == 16 * 4 + 32 * 4


# -- holders reached, holders named -----------------------------------------------------------------------


class Keeper:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def method(self) -> None:
        pass


def closure(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: tensor


def defaults(tensor: torch.Tensor) -> Callable[..., torch.Tensor]:
    def function(held: torch.Tensor = tensor) -> torch.Tensor:
        return held

    return function


def keyword_defaults(tensor: torch.Tensor) -> Callable[..., torch.Tensor]:
    def function(*, held: torch.Tensor = tensor) -> torch.Tensor:
        return held

    return function


REACHED: dict[str, Callable[[torch.Tensor], object]] = {
    "closure cell": closure,
    "default argument": defaults,
    "keyword default": keyword_defaults,
    "functools.partial argument": lambda tensor: functools.partial(torch.add, tensor),
    "functools.partial keyword": lambda tensor: functools.partial(torch.add, other=tensor),
    "bound method": lambda tensor: Keeper(tensor).method,
    "builtin bound method": lambda tensor: [tensor].append,
    "exception args": lambda tensor: RuntimeError("kept", tensor),
}


@pytest.mark.parametrize("holder", REACHED)
def test_cheap_holders_are_reached(observer: Observer, holder: str) -> None:
    root = nn.Module()
    root.child = nn.Module()
    found = started(root, observer)
    try:
        root.child.kept = REACHED[holder](torch.zeros(64))
        live, status = status_of(found)
    finally:
        found.uninstall()
    assert live == {"child": 64 * 4}
    assert status.census_skipped == {}


@functools.lru_cache
def cached(size: int) -> torch.Tensor:
    return torch.zeros(size)


def generator(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    yield tensor


SKIPPED: dict[str, Callable[[nn.Module], None]] = {
    "lru_cache": lambda module: setattr(module, "kept", cached),
    "generator": lambda module: setattr(module, "kept", generator(torch.zeros(8))),
    "mappingproxy": lambda module: setattr(module, "kept", types.MappingProxyType({"kv": torch.zeros(8)})),
    "module_outside_the_model": lambda module: setattr(module, "kept", [nn.Linear(2, 2)]),
    "module_added_after_load": lambda module: module.add_module("late", nn.Linear(2, 2)),
    "tensor_dict_key": lambda module: setattr(module, "kept", {torch.zeros(8): 1}),
}


@pytest.mark.parametrize("kind", SKIPPED)
def test_holders_not_looked_into_are_named_in_the_status(observer: Observer, kind: str) -> None:
    root = nn.Module()
    root.child = nn.Module()
    found = started(root, observer)
    try:
        assert status_of(found)[1].census_skipped == {}
        SKIPPED[kind](root.child)
        _, status = status_of(found)
    finally:
        found.uninstall()
    assert status.census_skipped == {kind: 1}
    assert kind in census.SKIPPED_HOLDERS
