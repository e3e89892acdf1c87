"""Observed owners stay what they were: their methods' kinds, TorchScript, cloudpickle; so do runners and workers.

The observer wraps an owner's entry methods on its class. A generator ``generate``, an ``async`` ``forward``
and an asynchronous generator stay so for ``inspect`` and for whoever drives them (send, throw, close, return
values), and the caches each step builds are still the owner's. ``torch.jit.script`` compiles an observed
owner's source against the original's globals, and cloudpickle pickles an observed owner's class by value.
The runner's ``capture_model`` keeps its signature, and works on copies, on ``__slots__`` runners and under class
patches made after load. A reloaded vLLM worker module's classes are hooked as the first ones were.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import subprocess
import sys
import types
from collections.abc import AsyncIterator, Callable, Generator
from types import SimpleNamespace
from typing import Any

import cloudpickle
import pytest
import torch
from transformers import DynamicCache

from modelkv_exporter.engine.observe import Observer, hooks
from modelkv_exporter.engine.samplers import PrivatePools
from modelkv_exporter.engine.vllm_hook import memory_parts
from modelkv_testbed import ROOT
from tests.engine.observing import add, figures, kv, storage_bytes


def stepping_class() -> type[torch.nn.Module]:
    """A fresh owner class (never wrapped before) whose entry points run in steps, each growing a cache."""

    class Stepping(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.caches: list[DynamicCache] = []
            self.outside: list[object] = []
            self.closed = False

        def model_local_kv_specs(self) -> list[object]:
            return []

        def _cache(self) -> DynamicCache:
            cache = DynamicCache()
            self.caches.append(cache)
            return cache

        def generate(self, steps: int) -> Generator[object, int | None, int]:
            cache = self._cache()
            try:
                for step in range(steps):
                    cache.update(kv(1, 1), kv(1, 1), 0)
                    try:
                        sent = yield step
                    except KeyError as error:
                        sent = yield f"caught {error}"
                    if sent is not None:
                        cache.update(kv(1, sent), kv(1, sent), 0)
            finally:
                self.closed = True
            return steps

        async def forward(self, tokens: int) -> int:
            cache = self._cache()
            cache.update(kv(1, tokens), kv(1, tokens), 0)
            await asyncio.sleep(0)
            cache.update(kv(1, tokens), kv(1, tokens), 0)
            return tokens

        async def stream(self, steps: int) -> AsyncIterator[int]:
            cache = self._cache()
            for step in range(steps):
                await asyncio.sleep(0)
                cache.update(kv(1, 1), kv(1, 1), 0)
                try:
                    yield step
                except KeyError:
                    yield -1

    return Stepping


def drive_generator(owner: Any) -> list[object]:
    """Everything a consumer sees of ``generate``: values, a sent value, a thrown error, the return value."""
    seen: list[object] = []
    steps = owner.generate(3)
    seen.append(next(steps))
    seen.append(hooks.running.get() is None)
    seen.append(steps.send(2))
    seen.append(steps.throw(KeyError("k")))
    seen.append(next(steps))
    try:
        next(steps)
    except StopIteration as stop:
        seen.append(("returned", stop.value))
    early = owner.generate(5)
    next(early)
    early.close()
    seen.append(owner.closed)
    return seen


async def drive_async(owner: Any) -> list[object]:
    """Everything a consumer sees of ``forward`` and ``stream``, two ``forward`` calls running at once included."""
    seen: list[object] = [await owner(2)]
    seen.append(await asyncio.gather(owner(1), owner(3)))
    stream = owner.stream(3)
    seen.append([await stream.__anext__(), hooks.running.get() is None])
    seen.append(await stream.athrow(KeyError("k")))
    seen.append([step async for step in stream])
    closing = owner.stream(4)
    seen.append(await closing.__anext__())
    await closing.aclose()
    return seen


def test_generator_and_coroutine_methods_stay_so_for_inspect(observer: Observer) -> None:
    cls = stepping_class()
    before = {name: kinds(getattr(cls, name)) for name in ("generate", "forward", "stream")}
    add(observer, cls())
    wrapped = {name: getattr(cls, name) for name in ("generate", "forward", "stream")}
    assert all(getattr(method, hooks.ENTRY, False) for method in wrapped.values()), "each is observed"
    assert {name: kinds(method) for name, method in wrapped.items()} == before
    assert before == {
        "generate": (True, False, False),
        "forward": (False, True, False),
        "stream": (False, False, True),
    }
    assert all(inspect.signature(wrapped[name]) == inspect.signature(wrapped[name].__wrapped__) for name in wrapped)


def kinds(function: Callable[..., Any]) -> tuple[bool, bool, bool]:
    return (
        inspect.isgeneratorfunction(function),
        inspect.iscoroutinefunction(function),
        inspect.isasyncgenfunction(function),
    )


def test_a_generator_owner_runs_as_before_and_each_step_is_observed(observer: Observer) -> None:
    unobserved = drive_generator(stepping_class()())
    owner: Any = stepping_class()()
    add(observer, owner)
    assert drive_generator(owner) == unobserved == [0, True, 1, "caught 'k'", 2, ("returned", 3), True]
    f = figures(observer, owner)
    assert f.live_bytes == storage_bytes(*owner.caches) > 0, "every step's cache bytes are the owner's"
    assert (f.calls, f.cache_calls) == (2, 2), "one call per generator, however many steps"


def test_coroutine_and_async_generator_owners_run_as_before_and_are_observed(observer: Observer) -> None:
    unobserved = asyncio.run(drive_async(stepping_class()()))
    owner: Any = stepping_class()()
    add(observer, owner)
    assert asyncio.run(drive_async(owner)) == unobserved == [2, [1, 3], [0, True], -1, [1, 2], 0]
    f = figures(observer, owner)
    assert f.live_bytes == storage_bytes(*owner.caches) > 0, "the caches built across awaits are the owner's"
    assert (f.calls, f.cache_calls) == (5, 5)


def helper(x: torch.Tensor) -> torch.Tensor:
    """A module-level function the scripted owner calls: TorchScript resolves it in its module's globals."""
    return torch.nn.functional.relu(x) + 1


class Scriptable(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def model_local_kv_specs(self) -> list[int]:
        return []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.doubled(helper(self.linear(x)))

    def doubled(self, x: torch.Tensor) -> torch.Tensor:
        return helper(x) * 2


def test_torch_jit_script_compiles_an_observed_owner(observer: Observer) -> None:
    owner = Scriptable()
    add(observer, owner)
    assert getattr(Scriptable.forward, hooks.ENTRY, False) and getattr(Scriptable.doubled, hooks.ENTRY, False)
    scripted = torch.jit.script(owner)
    x = torch.randn(2, 4)
    assert torch.equal(scripted(x), owner(x))
    assert figures(observer, owner).calls == 1, "the Python owner is still observed; the scripted copy is not it"


DYNAMIC = """
import torch
from transformers import DynamicCache


class Dynamic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((2,), 3.0))

    def model_local_kv_specs(self):
        return []

    def forward(self, x):
        DynamicCache().update(x.reshape(1, 1, 1, 2), x.reshape(1, 1, 1, 2), 0)
        return x * self.scale

    def generate(self, steps):
        for step in range(steps):
            yield self(torch.full((2,), float(step)))
"""


def dynamic_module() -> types.ModuleType:
    """A module made at run time and importable by no one: cloudpickle pickles its classes by value (as ``__main__``'s)."""
    module = types.ModuleType("modelkv_dynamic_owner")
    exec(compile(DYNAMIC, "<dynamic owner>", "exec"), module.__dict__)
    assert module.__name__ not in sys.modules
    return module


RECEIVER = """
import inspect, json, sys, cloudpickle, torch
owner = cloudpickle.loads(sys.stdin.buffer.read())
print(json.dumps({
    "forward": owner(torch.ones(2)).tolist(),
    "generate": [t.tolist() for t in owner.generate(2)],
    "generator": inspect.isgeneratorfunction(type(owner).generate),
    "module": type(owner).__module__,
}))
"""


def test_cloudpickle_pickles_an_observed_owner_by_value(observer: Observer) -> None:
    """The owner's class travels by value to a fresh interpreter (as Ray sends a class defined in ``__main__``)."""
    owner = dynamic_module().Dynamic()
    add(observer, owner)
    owner(torch.ones(2))
    pickled = cloudpickle.dumps(owner)
    assert torch.equal(cloudpickle.loads(pickled)(torch.ones(2)), torch.full((2,), 3.0))
    received = subprocess.run(
        [sys.executable, "-c", RECEIVER], input=pickled, capture_output=True, cwd=ROOT, timeout=300, check=False
    )
    assert received.returncode == 0, received.stderr.decode()[-3000:]
    assert json.loads(received.stdout) == {
        "forward": [3.0, 3.0],
        "generate": [[0.0, 0.0], [3.0, 3.0]],
        "generator": True,
        "module": "modelkv_dynamic_owner",
    }
    assert figures(observer, owner).calls == 1, "the copies are not the observed owner"


def test_the_wrapper_resolves_names_in_the_originals_globals(observer: Observer) -> None:
    """The mechanism TorchScript and cloudpickle rely on: a wrapper built on this module's globals sees ``helper``;
    one built on the wrapper module's (as a plain closure is) does not, and scripting fails."""
    add(observer, Scriptable())
    assert Scriptable.forward.__globals__ is helper.__globals__
    broken = types.FunctionType(
        Scriptable.forward.__code__, hooks.__dict__, "forward", None, Scriptable.forward.__closure__
    )
    broken.__wrapped__ = Scriptable.forward.__wrapped__  # type: ignore[attr-defined]

    class Broken(Scriptable):
        forward = broken  # type: ignore[assignment]

    with pytest.raises(RuntimeError, match="undefined value helper"):
        torch.jit.script(Broken())


class Runner:
    """A model runner as vLLM's: ``capture_model`` returns what the device's free memory dropped by."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pools = PrivatePools(0, 0)

    def capture_model(self, *, profile_only: bool = False) -> str:
        if not profile_only:
            self.pools = PrivatePools(self.pools.total + 100, self.pools.allocated + 60)
        return self.name


class SlotRunner:
    __slots__ = ("name", "pools", "__weakref__")

    def __init__(self, name: str) -> None:
        self.name = name
        self.pools = PrivatePools(0, 0)

    def capture_model(self, *, profile_only: bool = False) -> str:
        self.pools = PrivatePools(self.pools.total + 100, self.pools.allocated + 60)
        return self.name


def recorded(runner: Any) -> list[memory_parts.GraphPools]:
    """Hook ``runner``'s capture as the plugin does at load; the pools read are the runner's own."""
    seen: list[memory_parts.GraphPools] = []
    assert memory_parts.record_graph_capture(SimpleNamespace(model_runner=runner), seen.append, lambda: runner.pools)
    return seen


@pytest.mark.parametrize("cls", [Runner, SlotRunner], ids=["runner", "__slots__ runner"])
def test_the_capture_wrapper_keeps_the_signature_and_works_on_copies(cls: type[Any]) -> None:
    runner = cls("original")
    bound, unbound = inspect.signature(runner.capture_model), inspect.signature(cls.capture_model)
    seen = recorded(runner)
    assert (inspect.signature(runner.capture_model), inspect.signature(cls.capture_model)) == (bound, unbound)
    assert runner.capture_model() == "original" and seen == [memory_parts.GraphPools(100, 40)]
    twin = copy.copy(runner)
    twin.name = "copy"
    assert twin.capture_model() == "copy", "the copy captures on itself"
    assert twin.pools.total == 200 and runner.pools.total == 100 and len(seen) == 1, "and is not the recorded runner"
    assert cls("another").capture_model() == "another" and len(seen) == 1


def test_a_class_patch_made_after_load_is_respected() -> None:
    class Patched(Runner):
        def capture_model(self, *, profile_only: bool = False) -> str:
            return super().capture_model(profile_only=profile_only)

    recorded(Runner("base"))
    runner = Patched("loaded")
    seen = recorded(runner)
    assert runner.capture_model() == "loaded" and len(seen) == 1, "once, though the override and its base are wrapped"
    wrapped = Patched.capture_model

    def around(self: Patched, **kwargs: Any) -> str:
        return "around " + wrapped(self, **kwargs)

    Patched.capture_model = around  # type: ignore[method-assign]
    assert runner.capture_model() == "around loaded" and len(seen) == 2, "a patch around ours: both run"

    def instead(self: Patched, **kwargs: Any) -> str:
        return "instead"

    Patched.capture_model = instead  # type: ignore[method-assign]
    assert runner.capture_model() == "instead" and len(seen) == 2, "a patch instead of ours: only it runs"
