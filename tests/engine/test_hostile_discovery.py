"""Discovery as a guest in a hostile process: it runs none of the model's code, keeps no tensor alive, and lets no
failure out, not at the recursion limit, not through a broken logging handler.

Every hostile object here counts each call of its Python code; the census and attribution must leave every count
at 0. Each test failed on the tree before issue 33 (b54aaaa), which read ``__dict__`` through attribute access,
called ``isinstance`` (which reads ``__class__``), iterated containers through their own ``__iter__``, asked tensors
for their storage with ``__torch_function__`` on, read ``f_locals`` of the frames it walked, and logged inline on
its failure path.
"""

from __future__ import annotations

import collections
import logging
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from modelkv_exporter.engine.discover import Discovery, census
from modelkv_exporter.engine.discover.module_map import ModuleMap
from modelkv_exporter.engine.engine_log import ROOT
from modelkv_exporter.engine.observe import Observer, hooks
from tests.engine.test_discovery import EVERYTHING, beat

CALLS: collections.Counter[str] = collections.Counter()
"""Calls of the hostile objects' Python code, by name."""
BUDGET = census.Budget(modules=1000, objects=100_000, depth=8)


@pytest.fixture(autouse=True)
def counted() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


def run_census(root: nn.Module, *, parameters: bool = False) -> census.CensusResult:
    return census.run(census.census(ModuleMap(root), BUDGET, parameters=parameters), pause=False)


def found_bytes(result: census.CensusResult) -> int:
    return sum(size for _, size in result.storages().values())


# -- hostile objects ------------------------------------------------------------------------------------


class DictProperty:
    """``__dict__`` as a property, ``__getattr__`` and ``__getattribute__`` that count."""

    def __init__(self, tensor: torch.Tensor) -> None:
        object.__setattr__(self, "held", tensor)

    @property  # type: ignore[misc]
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        CALLS["__dict__"] += 1
        return {}

    def __getattr__(self, name: str) -> Any:
        CALLS["__getattr__"] += 1
        raise AttributeError(name)

    def __getattribute__(self, name: str) -> Any:
        CALLS["__getattribute__"] += 1
        return object.__getattribute__(self, name)


class ClassProperty:
    """``__class__`` as a property: ``isinstance`` reads it."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.held = tensor

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        CALLS["__class__"] += 1
        return dict


class CountingList(list):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[Any]:
        CALLS["list.__iter__"] += 1
        return super().__iter__()

    def __getitem__(self, index: Any) -> Any:
        CALLS["list.__getitem__"] += 1
        return super().__getitem__(index)

    def __len__(self) -> int:
        CALLS["list.__len__"] += 1
        return super().__len__()


class CountingDict(dict):  # type: ignore[type-arg]
    def values(self) -> Any:
        CALLS["dict.values"] += 1
        return super().values()

    def __iter__(self) -> Iterator[Any]:
        CALLS["dict.__iter__"] += 1
        return super().__iter__()

    def items(self) -> Any:
        CALLS["dict.items"] += 1
        return super().items()


class Key:
    """A dict key whose hash and equality count."""

    def __hash__(self) -> int:
        CALLS["__hash__"] += 1
        return 1

    def __eq__(self, other: object) -> bool:
        CALLS["__eq__"] += 1
        return self is other


class TorchFunction(torch.Tensor):
    """A tensor subclass whose ``__torch_function__`` counts (and would change results)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        CALLS["__torch_function__"] += 1
        return super().__torch_function__(func, types, args, kwargs or {})


class Meta(type):
    def __instancecheck__(cls, instance: object) -> bool:
        CALLS["__instancecheck__"] += 1
        return False

    def __subclasscheck__(cls, subclass: type) -> bool:
        CALLS["__subclasscheck__"] += 1
        return False


class WithMeta(metaclass=Meta):
    def __init__(self, tensor: torch.Tensor) -> None:
        self.held = tensor


class Hostile(nn.Module):
    """A module holding every hostile object, each with a tensor of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.a = DictProperty(torch.ones(100))
        self.b = ClassProperty(torch.ones(200))
        self.c = CountingList([torch.ones(300)])
        self.d = CountingDict(x=torch.ones(400))
        self.e = {Key(): torch.ones(500)}
        self.f = torch.ones(600).as_subclass(TorchFunction)
        self.g = WithMeta(torch.ones(700))


class HiddenDict(nn.Module):
    """A module with a ``__dict__`` property and a ``__getattribute__`` of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = torch.ones(800)

    @property  # type: ignore[misc]
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        CALLS["module.__dict__"] += 1
        return object.__getattribute__(self, "_modules")

    def __getattribute__(self, name: str) -> Any:
        CALLS["module.__getattribute__"] += 1
        return super().__getattribute__(name)


HOSTILE_BYTES = 4 * (100 + 200 + 300 + 400 + 500 + 600 + 700 + 800)


def test_the_census_runs_none_of_the_models_code_and_still_weighs_every_tensor() -> None:
    root = nn.Module()
    root.hostile = Hostile()
    root.hostile.hidden = HiddenDict()
    CALLS.clear()
    result = run_census(root, parameters=True)
    assert dict(CALLS) == {}
    assert found_bytes(result) == HOSTILE_BYTES
    assert sorted({index for index, _ in result.storages().values()}) == [1, 2], "at the hostile modules"


def test_a_discovery_beat_over_hostile_objects_runs_none_of_their_code(observer: Observer) -> None:
    root = nn.Module()
    found = Discovery(root, EVERYTHING, observer=observer)
    found.start()
    root.hostile = Hostile()
    root.hostile.hidden = HiddenDict()
    found.modules = ModuleMap(root)
    CALLS.clear()
    try:
        got = beat(found)
    finally:
        found.uninstall()
    assert dict(CALLS) == {}
    assert got[("hostile", "census")].live_bytes + got[("hostile.hidden", "census")].live_bytes == HOSTILE_BYTES


# -- tensors the census cannot read plainly -------------------------------------------------------------


class Wrapper(torch.Tensor):
    """A wrapper subclass (as DTensor, FP8 and torchao tensors): no storage of its own, its data in an inner tensor."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> Wrapper:
        made = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)  # type: ignore[attr-defined]
        made._inner = inner
        return made  # type: ignore[no-any-return]

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        CALLS["__tensor_flatten__"] += 1
        return ["_inner"], None

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        CALLS["__torch_dispatch__"] += 1
        raise RuntimeError("not for the census")


class Slotted:
    __slots__ = ("kv", "empty")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.kv = tensor


def test_wrapper_subclasses_nested_and_sparse_tensors_and_slots_are_weighed_meta_tensors_weigh_nothing(
    observer: Observer,
) -> None:
    root = nn.Module()
    found = Discovery(root, EVERYTHING, observer=observer)
    found.start()
    root.cache = nn.Module()
    root.cache.wrapped = Wrapper(torch.ones(1000))
    root.cache.nested = torch.nested.nested_tensor([torch.ones(3, 8), torch.ones(5, 8)], layout=torch.jagged)
    root.cache.sparse = torch.eye(64).to_sparse()
    root.cache.slotted = Slotted(torch.ones(2000))
    root.cache.__dict__["dead"] = weakref.proxy(nn.Linear(2, 2))
    root.cache.meta = torch.empty(1 << 28, device="meta")
    found.modules = ModuleMap(root)
    CALLS.clear()
    try:
        owner = beat(found)[("cache", "census")]
    finally:
        found.uninstall()
    assert found.enabled, found.reason
    nested = 8 * 8 * 4 + 3 * 8  # the values and the offsets
    sparse = 64 * 2 * 8 + 64 * 4  # int64 indices [2, 64] and float values [64]
    assert owner.live_bytes == 1000 * 4 + nested + sparse + 2000 * 4
    assert dict(CALLS) == {}, "__tensor_flatten__ and __torch_dispatch__ are the subclass's own code"


# -- innermost holders ----------------------------------------------------------------------------------


def test_a_dict_shared_by_a_parent_and_its_child_goes_to_the_child() -> None:
    shared = {"kv": torch.ones(1000)}
    root = nn.Module()
    root.parent = nn.Module()
    root.parent.child = nn.Module()
    root.parent.shared = shared
    root.parent.child.shared = shared
    result = run_census(root)
    paths = [path for path, _ in ModuleMap(root).modules]
    assert [paths[index] for index, _ in result.storages().values()] == ["parent.child"]


def test_a_cache_the_runner_builds_outside_the_model_and_a_module_keeps_is_found_at_that_module(
    observer: Observer,
) -> None:
    root = nn.Module()
    root.keeper = nn.Module()
    found = Discovery(root, EVERYTHING, observer=observer)
    found.start()
    try:
        cache = DynamicCache()
        for layer in range(2):
            cache.update(torch.ones(1, 2, 8, 16), torch.ones(1, 2, 8, 16), layer)
        root.keeper.kept = cache
        owner = beat(found)[("keeper", "cache_layer")]
    finally:
        found.uninstall()
    assert owner.live_bytes == 2 * 2 * (2 * 8 * 16 * 4)
    assert owner.layout is not None and (owner.layout.layers, owner.layout.rows) == (2, 1)


# -- no tensor kept alive -------------------------------------------------------------------------------


class Builder(nn.Module):
    """Builds and keeps a cache; its own scratch tensor is deleted before the call returns."""

    def forward(self) -> bool:
        scratch = torch.ones(1024)
        alive = weakref.ref(scratch)
        self.kept = DynamicCache()
        self.kept.update(torch.ones(1, 2, 4, 8), torch.ones(1, 2, 4, 8), 0)
        del scratch
        return alive() is None


class Runner:
    """A runner outside the model: a tensor its frame deletes after the model call must die then."""

    def __init__(self, body: Callable[[], Any]) -> None:
        self.body = body

    def step(self) -> bool:
        big = torch.ones(1 << 16)
        alive = weakref.ref(big)
        self.kept = self.body()
        del big
        return alive() is None


def build_outside() -> DynamicCache:
    cache = DynamicCache()
    cache.update(torch.ones(1, 2, 4, 8), torch.ones(1, 2, 4, 8), 0)
    return cache


@pytest.mark.parametrize("built", ["in the module", "outside the model"])
def test_attribution_keeps_no_tensor_of_the_frames_it_walks_alive(observer: Observer, built: str) -> None:
    root = nn.Module()
    root.builder = Builder()
    found = Discovery(root, EVERYTHING, observer=observer)
    found.start()
    try:
        if built == "in the module":
            assert Runner(root.builder).step(), "the runner's tensor died when its frame deleted it"
            assert root.builder(), "the module's scratch tensor died when forward deleted it"
        else:
            runner = Runner(build_outside)
            assert runner.step()
        assert found.enabled and len(hooks.records) > 0, "the layers were attributed"
    finally:
        found.uninstall()


def test_a_tensor_dropped_between_two_census_slices_dies_then() -> None:
    root = nn.Module()
    holder = nn.Module()
    root.holder = holder
    for index in range(40):
        setattr(holder, f"t{index}", torch.ones(16))
    holder.items = [torch.ones(16) for _ in range(40)]
    last = weakref.ref(holder.t39)
    in_list = weakref.ref(holder.items[39])
    walk = census.census(ModuleMap(root), BUDGET, slice_seconds=0.0)
    next(walk)
    del holder.t39
    holder.items[39] = None
    assert last() is None and in_list() is None, "the census holds no tensor between slices"
    result = census.run(walk, pause=False)
    assert len(result.storages()) == 78


def test_a_huge_list_and_dict_are_walked_in_many_short_slices_and_a_changing_dict_is_left_where_it_is() -> None:
    root = nn.Module()
    root.huge = [[item] for item in range(200_000)]
    root.keyed = {item: [item] for item in range(50_000)}
    walk = census.census(ModuleMap(root), census.Budget(1000, 1_000_000, 8))
    slices = 0
    try:
        while True:
            next(walk)
            slices += 1
            if slices == 3:
                root.keyed[-1] = [0]  # the dict changes size while it is walked
    except StopIteration as done:
        result: census.CensusResult = done.value
    assert slices > 20
    assert result.longest_slice < 0.05, "no slice walks a whole container"
    assert result.objects > 200_000


# -- no failure reaches the model, not even the failure path's ------------------------------------------


class RaisingHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        raise RuntimeError("the handler broke")


@pytest.fixture
def raising_handler() -> Iterator[None]:
    handler = RaisingHandler()
    logger = logging.getLogger(ROOT)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("error", [RuntimeError("attribution broke"), MemoryError(), RecursionError()])
def test_a_failing_attribution_with_a_raising_log_handler_never_reaches_the_model(
    observer: Observer, raising_handler: None, monkeypatch, error: BaseException
) -> None:
    root = nn.Module()
    root.builder = Builder()
    found = Discovery(root, EVERYTHING, observer=observer)
    found.start()

    def broken(layer: object) -> None:
        raise error

    monkeypatch.setattr(found, "_attribute", broken)
    hooks.discover = found.attribute
    try:
        root.builder()
    finally:
        found.uninstall()
    assert root.builder.kept.get_seq_length() == 4
    assert not found.enabled and hooks.discover is None


def recursion_depth() -> int:
    """The interpreter's recursion depth here, as ``sys.setrecursionlimit`` counts it (it refuses a limit at or below)."""
    limit = sys.getrecursionlimit()
    low, high = 1, limit
    while low < high:
        middle = (low + high) // 2
        try:
            sys.setrecursionlimit(middle)
        except RecursionError:
            low = middle + 1
        else:
            high = middle
    sys.setrecursionlimit(limit)
    return low - 1


def call_with_room(room: int, function: Callable[[], Any]) -> bool:
    """Call ``function`` with the recursion limit ``room`` frames above this one; whether a RecursionError escaped."""
    depth = recursion_depth()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + room)
    try:
        function()
    except RecursionError:
        return True
    finally:
        sys.setrecursionlimit(limit)
    return False


def test_the_failure_path_near_the_recursion_limit_never_raises(observer: Observer) -> None:
    root = nn.Module()
    found = Discovery(root, EVERYTHING, observer=observer)
    rooms = range(1, 60)
    callable_rooms = [room for room in rooms if not call_with_room(room, lambda: None)]
    escaped = [room for room in callable_rooms if call_with_room(room, lambda: found.fail("a site", RecursionError()))]
    found.uninstall()
    assert callable_rooms and escaped == []
    assert not found.enabled


def test_attribution_near_the_recursion_limit_returns_none_and_turns_discovery_off(observer: Observer) -> None:
    root = nn.Module()
    root.builder = Builder()
    found = Discovery(root, EVERYTHING, observer=observer)
    results: list[object] = []
    escaped = [room for room in range(1, 40) if call_with_room(room, lambda: results.append(found.attribute(object())))]
    found.uninstall()
    assert None in results and not found.enabled
    assert escaped == [room for room in range(1, 40) if call_with_room(room, lambda: results.append(one_frame(None)))]


def one_frame(argument: object) -> None:
    """As many frames as ``Discovery.attribute`` takes to start."""
