"""The engine's one tensor weigher runs none of the model's code, whatever tensor a cache or a module holds.

Issue 46, break 4 (the tensor half). Each hostile tensor here counts its own Python code (``__torch_dispatch__``,
``__torch_function__``, ``__tensor_flatten__``); the weigher must add no call to what the model's own operations
make (counted with the hook on, minus the hook off). A wrapper subclass (``_make_wrapper_subclass``, as FP8,
torchao and DTensor are made) is weighed through the inner tensors among its attributes, or counted as unknown;
never does it turn discovery or observation off. The weights walk reads a module's instance dict with ``dict``'s own
methods, never those of a dict subclass put in its place.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from modelkv_exporter.engine import tensors
from modelkv_exporter.engine.discover import Discovery
from modelkv_exporter.engine.discover.module_map import ModuleMap
from modelkv_exporter.engine.observe import Observer, hooks
from modelkv_exporter.engine.weights import model_weight_bytes
from tests.engine.observing import Owner, add, figures, kv
from tests.engine.test_discovery import EVERYTHING, beat

CALLS: collections.Counter[str] = collections.Counter()
"""Calls of the hostile tensors' Python code, by name."""


@pytest.fixture(autouse=True)
def counted() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


# -- hostile tensors ------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A plain tensor sharing ``value``'s storage (inside ``__torch_dispatch__``, with Python dispatch off)."""
    return torch.Tensor._make_subclass(torch.Tensor, value) if type(value) is SizesTensor else value  # type: ignore[attr-defined]


class SizesTensor(torch.Tensor):
    """A subclass with a storage of its own that sends its sizes, device and layout to ``__torch_dispatch__``."""

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> SizesTensor:
        return torch.Tensor._make_subclass(  # type: ignore[attr-defined,no-any-return]
            cls, data, False, dispatch_sizes_strides_policy="sizes", dispatch_device=True, dispatch_layout=True
        )

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        CALLS["__torch_dispatch__"] += 1
        with torch._C._DisableTorchDispatch():
            out = func(*torch.utils._pytree.tree_map(_plain, args), **(kwargs or {}))
            return SizesTensor(out) if type(out) is torch.Tensor and func is not torch.ops.aten.detach.default else out


class Wrapper(torch.Tensor):
    """A wrapper subclass (as FP8, torchao and DTensor tensors): no storage of its own, its data an inner tensor that
    ``__tensor_flatten__`` names; sizes sent to ``__torch_dispatch__`` too."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> Wrapper:
        made = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, inner.shape, dtype=inner.dtype, device=inner.device, dispatch_sizes_strides_policy="sizes"
        )
        made._inner = inner
        return made  # type: ignore[no-any-return]

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        CALLS["__tensor_flatten__"] += 1
        return ["_inner"], None

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        CALLS["__torch_dispatch__"] += 1
        unwrap: Callable[[Any], Any] = lambda value: value._inner if isinstance(value, Wrapper) else value  # noqa: E731
        out = func(*torch.utils._pytree.tree_map(unwrap, args), **(kwargs or {}))
        return cls(out) if type(out) is torch.Tensor else out


HIDDEN: dict[int, torch.Tensor] = {}
"""Where ``Opaque`` keeps its data: outside the model's modules, so neither the weigher nor the census reaches it
(a closure would not do: the census reads closure cells)."""


class Opaque(Wrapper):
    """A wrapper whose data only its own code can reach: its bytes are unknown."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> Opaque:
        made = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)  # type: ignore[attr-defined]
        HIDDEN[id(made)] = inner
        weakref.finalize(made, HIDDEN.pop, id(made), None)
        return made  # type: ignore[no-any-return]

    @property
    def _inner(self) -> torch.Tensor:  # type: ignore[override]
        CALLS["_inner"] += 1
        return HIDDEN[id(self)]


class Counted(torch.Tensor):
    """A subclass whose ``__torch_function__`` counts every call."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        CALLS["__torch_function__"] += 1
        return super().__torch_function__(func, types, args, kwargs or {})


class Mode(TorchDispatchMode):
    """A dispatch mode counting every operation it sees (a profiler's, a fake tensor's)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        CALLS["mode"] += 1
        return func(*args, **(kwargs or {}))


class CountingDict(dict):  # type: ignore[type-arg]
    """An instance ``__dict__`` whose methods count (CPython's attribute look-ups never call them)."""

    def get(self, *args: Any) -> Any:
        CALLS["get"] += 1
        return super().get(*args)

    def __getitem__(self, key: Any) -> Any:
        CALLS["__getitem__"] += 1
        return super().__getitem__(key)

    def __iter__(self) -> Any:
        CALLS["__iter__"] += 1
        return super().__iter__()

    def values(self) -> Any:
        CALLS["values"] += 1
        return super().values()

    def items(self) -> Any:
        CALLS["items"] += 1
        return super().items()

    def __len__(self) -> int:
        CALLS["__len__"] += 1
        return super().__len__()


# -- in a cache layer under observation -----------------------------------------------------------------------


def updates(make: Callable[[torch.Tensor], torch.Tensor], steps: int = 3) -> Callable[[Owner], None]:
    """An owner's call that updates one real ``DynamicCache`` layer ``steps`` times with ``make``'s tensors."""

    def run(self: Owner) -> None:
        cache = DynamicCache()
        for _ in range(steps):
            cache.update(make(kv(1, 2)), make(kv(1, 2)), 0)
        self.kept["cache"] = cache

    return run


def dispatched(owner: Owner, run: Callable[[Owner], None]) -> int:
    CALLS.clear()
    owner(run)
    return CALLS["__torch_dispatch__"]


def test_a_subclass_dispatching_its_sizes_to_python_is_weighed_without_one_dispatch(observer: Observer) -> None:
    owner = Owner()
    run = updates(SizesTensor)
    off = dispatched(owner, run)
    add(observer, owner)
    on = dispatched(owner, run)
    assert off > 0, "the model's own operations dispatch"
    assert on - off == 0, f"{on - off} dispatch calls from the hooks over 3 updates"
    assert hooks.broken() is None
    f = figures(observer, owner)
    assert f.available and f.live_bytes == 2 * kv(1, 6).nbytes


def test_a_wrapper_subclass_in_a_layer_is_weighed_through_its_inner_tensors_without_its_code(
    observer: Observer,
) -> None:
    owner = Owner()
    run = updates(Wrapper)
    off = dispatched(owner, run)
    add(observer, owner)
    on = dispatched(owner, run)
    assert on - off == 0 and CALLS["__tensor_flatten__"] == 0
    assert hooks.broken() is None
    f = figures(observer, owner)
    assert f.available and f.live_bytes == 2 * kv(1, 6).nbytes


def test_a_layer_of_opaque_wrappers_is_unknown_its_neighbours_observed_and_nothing_turned_off(
    observer: Observer,
) -> None:
    opaque, plain = Owner(), Owner()
    opaque(updates(Opaque, steps=1))
    off, CALLS["_inner"] = CALLS["_inner"], 0
    add(observer, opaque, plain)
    opaque(updates(Opaque, steps=1))
    plain(updates(lambda tensor: tensor))
    assert hooks.broken() is None and observer.enabled
    hidden, seen = figures(observer, opaque), figures(observer, plain)
    assert not hidden.available and hidden.live_bytes is None and "Opaque" in (hidden.reason or "")
    assert seen.available and seen.live_bytes == 2 * kv(1, 6).nbytes
    assert CALLS["_inner"] == off, "the hooks never read the wrapper's property"


@pytest.mark.parametrize(
    "make",
    [SizesTensor, Wrapper, lambda tensor: tensor.as_subclass(Counted)],
    ids=["dispatches-sizes", "wrapper", "torch-function"],
)
def test_discovery_stays_on_and_weighs_hostile_tensors_in_a_cache_a_module_keeps(
    observer: Observer, make: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    root = nn.Module()
    root.keeper = nn.Module()
    found = Discovery(root, EVERYTHING, observer=observer)
    found.start()
    try:
        cache = DynamicCache()
        for layer in range(2):
            cache.update(make(kv(1, 8)), make(kv(1, 8)), layer)
        root.keeper.kept = cache
        root.keeper.loose = make(torch.ones(1000))
        found.modules = ModuleMap(root)
        CALLS.clear()
        got = beat(found)
    finally:
        found.uninstall()
    assert found.enabled, found.reason
    assert dict(CALLS) == {}, "the census and the sample run none of the tensors' code"
    assert got[("keeper", "cache_layer")].live_bytes == 2 * 2 * kv(1, 8).nbytes
    assert got[("keeper", "census")].live_bytes == 1000 * 4


def test_an_opaque_wrapper_in_a_cache_a_module_keeps_leaves_discovery_on(observer: Observer) -> None:
    root = nn.Module()
    root.keeper = nn.Module()
    found = Discovery(root, EVERYTHING, observer=observer)
    found.start()
    try:
        cache = DynamicCache()
        cache.update(Opaque(kv(1, 8)), Opaque(kv(1, 8)), 0)
        root.keeper.kept = cache
        root.keeper.loose = torch.ones(1000)
        found.modules = ModuleMap(root)
        CALLS.clear()
        got = beat(found)
    finally:
        found.uninstall()
    assert found.enabled, found.reason
    assert got[("keeper", "census")].live_bytes == 1000 * 4
    assert CALLS["_inner"] == 0


# -- the weigher itself: meta, sparse, modes, wrappers ----------------------------------------------------------


def weighed(tensor: Any) -> tuple[bool, int]:
    out: dict[tensors.StorageKey, int] = {}
    known = tensors.weigh(tensor, out)
    return known, sum(out.values())


def test_meta_weighs_nothing_sparse_weighs_its_parts_and_no_dispatch_mode_sees_a_read() -> None:
    meta = torch.empty(1 << 28, device="meta")
    coo = torch.eye(64).to_sparse()
    csr = torch.eye(64).to_sparse_csr()
    bsc = torch.eye(64).to_sparse_bsc((8, 8))
    with Mode():
        found = [weighed(t) for t in (meta, coo, csr, bsc)]
    assert CALLS["mode"] == 0, "the weigher's reads reach no dispatch mode"
    assert found == [(True, 0), *((True, parts_bytes(t)) for t in (coo, csr, bsc))]
    assert parts_bytes(coo) == 64 * 2 * 8 + 64 * 4  # int64 indices [2, 64], float values [64]


def parts_bytes(sparse: torch.Tensor) -> int:
    """Independent count: the storages of a sparse tensor's parts (torch may allocate more than they show)."""
    if sparse.layout is torch.sparse_coo:
        parts = (sparse._indices(), sparse._values())
    elif sparse.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = (sparse.crow_indices(), sparse.col_indices(), sparse.values())
    else:
        parts = (sparse.ccol_indices(), sparse.row_indices(), sparse.values())
    return sum(part.untyped_storage().nbytes() for part in parts)


def test_views_count_their_storage_once_and_wrappers_of_wrappers_reach_their_inner_tensors() -> None:
    inner = torch.ones(100)
    view, wrapped = inner[10:], Wrapper(inner)
    nested, opaque = Wrapper(Wrapper(SizesTensor(torch.ones(10)))), Opaque(torch.ones(10))
    CALLS.clear()
    out: dict[tensors.StorageKey, int] = {}
    assert tensors.weigh(view, out) and tensors.weigh(inner, out) and tensors.weigh(wrapped, out)
    assert sum(out.values()) == 400
    assert weighed(nested) == (True, 40)
    assert weighed(opaque) == (False, 0)
    assert weighed("not a tensor") == (False, 0)
    assert dict(CALLS) == {}


# -- the weights walk ------------------------------------------------------------------------------------------


def test_weights_of_hostile_tensors_are_weighed_without_their_code_and_an_opaque_one_is_unknown() -> None:
    model = nn.Module()
    model.register_buffer("dispatching", SizesTensor(torch.ones(10)))
    model.register_buffer("wrapped", Wrapper(torch.ones(20)))
    model.counted = nn.Parameter(torch.ones(30).as_subclass(Counted), requires_grad=False)
    model.register_buffer("sparse", torch.eye(8).to_sparse())
    model.register_buffer("meta", torch.empty(1 << 20, device="meta"))
    CALLS.clear()
    assert model_weight_bytes(model, "cpu") == (10 + 20 + 30) * 4 + 8 * 2 * 8 + 8 * 4
    assert dict(CALLS) == {}
    model.register_buffer("opaque", Opaque(torch.ones(5)))
    CALLS.clear()
    assert model_weight_bytes(model, "cpu") is None, "a weight that cannot be read is unknown, not 0"
    assert CALLS["_inner"] == 0


def test_the_weights_walk_calls_no_method_of_a_dict_subclass_put_as_a_modules_dict() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    for module in (model, model[0]):
        object.__setattr__(module, "__dict__", CountingDict(module.__dict__))
    assert type(model.__dict__) is CountingDict
    CALLS.clear()
    assert model_weight_bytes(model, "cpu") == (4 * 4 + 4 + 4 * 2 + 2) * 4
    assert dict(CALLS) == {}


def test_the_hostile_tensors_are_hostile_to_the_reads_the_weigher_avoids() -> None:
    """The mechanism the tests above guard: each read the weigher leaves alone runs the subclass's code."""
    base = torch._C.TensorBase
    sizes, wrapped, counted = SizesTensor(torch.ones(4)), Wrapper(torch.ones(4)), torch.ones(4).as_subclass(Counted)
    reads: dict[str, Callable[[Any], Any]] = {
        "nbytes": vars(base)["nbytes"].__get__,
        "is_meta": vars(base)["is_meta"].__get__,
        "device": vars(base)["device"].__get__,
        "layout": vars(base)["layout"].__get__,
        "data_ptr": base.data_ptr,
        "dim": base.dim,
    }
    for name, read in reads.items():
        CALLS.clear()
        read(sizes)
        assert CALLS["__torch_dispatch__"] >= 1, name
    CALLS.clear()
    base.nbytes.__get__(wrapped)
    base.untyped_storage(counted)
    assert CALLS == {"__torch_dispatch__": 1, "__torch_function__": 1}
    with pytest.raises(RuntimeError):
        base.untyped_storage(wrapped).data_ptr()  # no storage of its own: what turned discovery off
