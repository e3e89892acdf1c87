"""A sample on the heartbeat thread never holds the lock the model's cache updates take for long, and stays exact."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from transformers import DynamicCache

from modelkv_exporter.engine.observe import Observer, hooks
from modelkv_exporter.engine.observe import tally as tally_module
from tests.engine.observing import Owner, add, figures, kv, storage_bytes

LAYERS = 2000
MOST_PER_HOLD = 256


class CountingLock:
    """The hooks' lock, counting the layers a sample weighs while it holds it (outermost holds only)."""

    def __init__(self) -> None:
        self.inner = threading.RLock()
        self.depth = 0
        self.weighed = 0
        self.most = 0

    def acquire(self, *args: Any) -> bool:
        self.inner.acquire()
        self.depth += 1
        if self.depth == 1:
            self.weighed = 0
        return True

    def release(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.most = max(self.most, self.weighed)
        self.inner.release()

    def __enter__(self) -> CountingLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_sample_weighs_a_bounded_number_of_layers_per_hold_of_the_lock(
    observer: Observer, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = Owner()
    add(observer, owner)

    def run(self: Owner) -> None:
        cache = DynamicCache()
        for layer in range(LAYERS):
            cache.update(kv(1, 1), kv(1, 1), layer)
        self.kept["cache"] = cache

    owner(run)
    lock = CountingLock()
    real_storages = tally_module.storages

    def counted(*args: Any) -> Any:
        lock.weighed += 1
        return real_storages(*args)

    monkeypatch.setattr(hooks, "lock", lock)
    monkeypatch.setattr(tally_module, "storages", counted)
    f = figures(observer, owner)
    assert f.live_bytes == storage_bytes(owner.kept["cache"]) == LAYERS * 2 * kv(1, 1).nbytes
    assert 0 < lock.most <= MOST_PER_HOLD, f"{lock.most} layers weighed in one hold of the lock"


def test_chunked_samples_beside_a_model_that_updates_count_every_byte_once(observer: Observer) -> None:
    """Layers only grow here, so the peak is the final live figure exactly: a change counted twice by a sample
    and by the model (or lost between two chunks) moves one of them."""
    owner = Owner()
    add(observer, owner)
    cache = DynamicCache()
    owner(lambda self: [cache.update(kv(1, 1), kv(1, 1), layer) for layer in range(600)])
    stop = threading.Event()

    def sampling() -> None:
        while not stop.is_set():
            observer.sample()

    sampler = threading.Thread(target=sampling, name="sampler")
    sampler.start()
    try:
        for _ in range(3):
            owner(lambda self: [cache.update(kv(1, 1), kv(1, 1), layer) for layer in range(0, 600, 7)])
    finally:
        stop.set()
        sampler.join(30)
    f = figures(observer, owner)
    assert f.live_bytes == storage_bytes(cache)
    assert f.peak_bytes == f.live_bytes
