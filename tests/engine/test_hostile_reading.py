"""The hooks read caches without running the model's code, weigh only real memory, and need no collector."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache, cache_utils

from modelkv_exporter.engine.observe import Observer, hooks, layers
from tests.engine.observing import Owner, add, figures, kv

ROOT = Path(__file__).resolve().parents[2]


class Counted(torch.Tensor):
    """A tensor subclass whose ``__torch_function__`` counts every call (the model's own code)."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        Counted.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def run_counted(owner: Owner) -> tuple[int, torch.Tensor]:
    Counted.calls = 0

    def run(self: Owner) -> torch.Tensor:
        cache = DynamicCache()
        for _ in range(3):
            keys, _ = cache.update(kv(1, 2).as_subclass(Counted), kv(1, 2).as_subclass(Counted), 0)
        self.kept["cache"] = cache
        return keys.as_subclass(torch.Tensor)

    result = owner(run)
    return Counted.calls, result


def test_a_tensor_subclass_torch_function_is_never_run_by_the_hooks(observer: Observer) -> None:
    owner = Owner()
    torch.manual_seed(0)
    calls_off, result_off = run_counted(owner)
    add(observer, owner)
    torch.manual_seed(0)
    calls_on, result_on = run_counted(owner)
    observer.sample()
    assert Counted.calls == calls_on == calls_off and torch.equal(result_on, result_off)
    f = figures(observer, owner)
    assert f.available and f.live_bytes == 2 * kv(1, 6).nbytes


def test_a_torch_function_mode_is_never_run_by_the_hooks(observer: Observer) -> None:
    class Mode(torch.overrides.TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            Mode.calls += 1
            return func(*args, **(kwargs or {}))

    owner = Owner()
    x = kv(1, 2)

    def run(self: Owner) -> None:
        with Mode():
            DynamicCache().update(x, x, 0)

    owner(run)
    off, Mode.calls = Mode.calls, 0
    add(observer, owner)
    owner(run)
    assert Mode.calls == off


def test_a_layer_whose_dict_is_a_property_is_read_without_calling_it(observer: Observer) -> None:
    calls: list[str] = []

    class Hostile(cache_utils.DynamicLayer):
        @property  # type: ignore[misc]
        def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
            calls.append("__dict__")
            return {}

        def __getattribute__(self, name: str) -> Any:
            if name == "__dict__":
                calls.append("__getattribute__")
            return super().__getattribute__(name)

    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = cache_utils.Cache(layers=[Hostile()])
        cache.update(kv(1, 2), kv(1, 2), 0)
        self.kept["cache"] = cache

    owner(run)
    f = figures(observer, owner)
    assert not calls, calls
    assert f.available and f.live_bytes == 2 * kv(1, 2).nbytes


def test_a_patched_getattribute_on_a_fast_path_class_is_never_run(observer: Observer, monkeypatch: Any) -> None:
    """The update's fast path reads ``layer.__dict__`` as an attribute; a class whose ``__getattribute__`` a model
    replaced takes the descriptor path instead, and the replacement never runs for our reads."""
    read: list[str] = []

    def spying(self: Any, name: str) -> Any:
        if name == "__dict__":
            read.append(name)
        return object.__getattribute__(self, name)

    monkeypatch.setattr(cache_utils.DynamicLayer, "__getattribute__", spying)
    layers.forget_plans()
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = DynamicCache()
        for _ in range(3):
            cache.update(kv(1, 2), kv(1, 2), 0)
        self.kept["cache"] = cache

    owner(run)
    observer.sample()
    f = figures(observer, owner)
    assert not read, read
    assert f.available and f.live_bytes == 2 * kv(1, 6).nbytes


def test_meta_tensors_weigh_nothing(observer: Observer) -> None:
    owner = Owner()
    add(observer, owner)
    big = torch.empty(1024, 16, 1024, 16, device="meta")  # 1 GiB, were it real

    def run(self: Owner) -> None:
        cache = DynamicCache()
        cache.update(big, big, 0)
        self.kept["cache"] = cache

    owner(run)
    f = figures(observer, owner)
    assert f.available and f.peak_bytes == f.live_bytes == 0


def test_observation_works_with_the_collector_off_at_install() -> None:
    script = textwrap.dedent(
        """
        import gc
        gc.disable()
        from modelkv_exporter.engine.observe import install

        observer = install([], enabled=True)  # the first caches this process builds: the probe's
        assert observer.unavailable is None, observer.unavailable
        from transformers import DynamicCache
        from tests.engine.observing import Owner, add, figures, kv

        owner = Owner()
        add(observer, owner)
        owner(lambda self: self.kept.setdefault("c", DynamicCache()).update(kv(1, 2), kv(1, 2), 0))
        f = figures(observer, owner)
        assert f.available and f.live_bytes == 2 * kv(1, 2).nbytes, f
        assert not gc.isenabled()
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_reused_dict_key_never_reaches_a_dict_subclass(observer: Observer) -> None:
    """A layer whose instance dict was replaced by a dict subclass: its ``get`` is the model's code."""
    calls: list[str] = []

    class Spying(dict):  # type: ignore[type-arg]
        def get(self, *args: Any) -> Any:
            calls.append("get")
            return super().get(*args)

    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = DynamicCache()
        cache.update(kv(1, 2), kv(1, 2), 0)
        layer = cache.layers[0]
        layer.__dict__ = Spying(layer.__dict__)
        cache.update(kv(1, 1), kv(1, 1), 0)
        self.kept["cache"] = cache

    owner(run)
    assert figures(observer, owner).live_bytes == 2 * kv(1, 3).nbytes
    assert not calls and hooks.active()
