"""Scenes of ``tests/engine/test_hostile_hot_path.py`` and ``bench/hot_path.py``: the layers an owner keeps, a heartbeat
sampling without pause, a model thread updating; and the scenes that can hang, each run in a process of its own
(``python -m ... SCENE``).

- ``deadlock [on|off]``: a heartbeat samples 2 000 live layers without pause while a model thread, holding its own
  lock, makes garbage whose finaliser takes that lock and updates a cache; the collector runs on both threads
  (a low threshold). Exits 0 when the model thread's 400 updates are done.
- ``fork``: a heartbeat samples 10 000 live layers without pause while the main thread forks 12 children; each
  child updates a cache in an owner call and samples once, under a 20 s alarm. Exits 0 when every child did.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache

from modelkv_exporter.engine.observe import Observer, install

torch.set_num_threads(1)


class Owner(torch.nn.Module):
    """A declaring owner whose ``forward`` runs whatever callable it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[str, Any] = {}

    def model_local_kv_specs(self) -> list[object]:
        return []

    def forward(self, run: Callable[[Owner], Any]) -> Any:
        return run(self)


def kv(batch: int, tokens: int) -> torch.Tensor:
    """Key or value states ``[batch, 2 heads, tokens, 8]``."""
    return torch.ones(batch, 2, tokens, 8)


class WaitingLock:
    """The hooks' lock, counting acquisitions and timing every one that had to wait, by thread name."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.taken: dict[str, int] = {}
        self.waits: dict[str, list[float]] = {}

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        name = threading.current_thread().name
        self.taken[name] = self.taken.get(name, 0) + 1
        if self.inner.acquire(False):
            return True
        if not blocking:
            return False
        started = time.perf_counter()
        got = bool(self.inner.acquire(True, timeout))
        self.waits.setdefault(name, []).append(time.perf_counter() - started)
        return got

    def release(self) -> None:
        self.inner.release()

    def __enter__(self) -> WaitingLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def keep_layers(observer: Observer, layers: int) -> Owner:
    """An observed owner that keeps ``layers`` live layers (100 a cache)."""
    owner = Owner()
    observer.add_owners([("keeper", owner)])
    one = kv(1, 1)

    def build(self: Owner) -> None:
        self.kept["caches"] = caches = []
        for _ in range(layers // 100):
            cache = DynamicCache()
            for layer in range(100):
                cache.update(one, one, layer)
            caches.append(cache)

    owner(build)
    return owner


def sampling(observer: Observer) -> threading.Event:
    """A heartbeat thread sampling without pause until the returned event is set."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            observer.sample()

    threading.Thread(target=run, name="heartbeat", daemon=True).start()
    return stop


def updating(owner: Owner) -> None:
    """One cache update in an owner call, of a layer reset to one position first (so it never grows)."""
    one = kv(1, 1)
    cache = owner.kept.setdefault("reused", DynamicCache())
    if cache.layers:
        cache.layers[0].keys, cache.layers[0].values = one, one

    def step(self: Owner) -> None:
        cache.update(one, one, 0)

    owner(step)


def deadlock(hook: bool) -> int:
    observer = install([], enabled=hook)
    owner = keep_layers(observer, 2000)
    model_lock = threading.RLock()

    class Finalised:
        """A model object in a cycle whose finaliser takes the model's lock."""

        def __init__(self) -> None:
            self.cycle: Any = self

        def __del__(self) -> None:
            with model_lock:
                pass

    stop = sampling(observer)
    gc.set_threshold(20, 1, 1)
    done = []

    def model() -> None:
        for _ in range(400):
            with model_lock:
                Finalised()
                updating(owner)
            time.sleep(0)
        done.append(True)

    thread = threading.Thread(target=model, name="model", daemon=True)
    thread.start()
    thread.join(60)
    stop.set()
    print("model thread finished" if done else "model thread never finished", flush=True)
    return 0 if done else 1


def fork() -> int:
    observer = install([], enabled=True)
    owner = keep_layers(observer, 10_000)
    updating(owner)
    stop = sampling(observer)
    children = []
    for child in range(12):
        time.sleep(0.013 * (child % 5 + 1))
        pid = os.fork()
        if pid == 0:
            import signal

            signal.alarm(20)
            updating(owner)
            observer.sample()
            os._exit(0)
        children.append(pid)
    stop.set()
    codes = [os.waitpid(pid, 0)[1] for pid in children]
    hung = sum(1 for code in codes if code != 0)
    print(f"{hung} of {len(codes)} children did not finish their first update and sample", flush=True)
    return 0 if hung == 0 else 1


if __name__ == "__main__":
    scene = sys.argv[1]
    code = deadlock(sys.argv[2] == "on") if scene == "deadlock" else fork()
    sys.stdout.flush()
    os._exit(code)
