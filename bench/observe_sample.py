"""How long a sample on the heartbeat thread holds the lock every cache update takes, at 10 000 live layers.

One owner keeps ``--layers`` live ``DynamicLayer``s (100 caches). The hooks' lock is replaced by a
timing wrapper that records every outermost hold; ``Observer.sample()`` runs ``--samples`` times
on the main thread, and the longest single hold and the whole sample's time are printed. Then a
model thread updates a reused cache in a loop while samples run, and the longest update it saw
is printed beside the longest with no sample running (both include waiting for the GIL: the
interpreter switches threads every ``sys.getswitchinterval()``), with the longest the model thread
waited for the hooks' lock itself.

Runs on any tree that has ``hooks.lock`` and ``Observer.sample`` (the one before chunked samples too):

    .venv/bin/python -m bench.observe_sample [--layers 10000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from modelkv_exporter.engine.observe import hooks, install
from modelkv_testbed.bench_tables import RECORD_HELP, recorded

ROOT = Path(__file__).resolve().parent.parent
torch.set_num_threads(1)


class TimedLock:
    """The hooks' lock, timing each outermost hold per thread name."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.depth = 0
        self.since = 0.0
        self.holds: dict[str, list[float]] = {}
        self.waits: dict[str, list[float]] = {}

    def acquire(self, *args: Any) -> bool:
        started = time.perf_counter()
        self.inner.acquire()
        waited = time.perf_counter() - started
        self.waits.setdefault(threading.current_thread().name, []).append(waited)
        self.depth += 1
        if self.depth == 1:
            self.since = time.perf_counter()
        return True

    def release(self) -> None:
        if self.depth == 1:
            held = time.perf_counter() - self.since
            self.holds.setdefault(threading.current_thread().name, []).append(held)
        self.depth -= 1
        self.inner.release()

    def __enter__(self) -> TimedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Keeper(torch.nn.Module):
    """An owner that builds caches and keeps them."""

    def __init__(self) -> None:
        super().__init__()
        self.caches: list[Any] = []

    def model_local_kv_specs(self) -> list[Any]:
        return []

    def forward(self, run: Any) -> Any:
        return run(self)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    parser.add_argument("--layers", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    owner = Keeper()
    observer = install([("keeper", owner)], enabled=True)
    assert observer.unavailable is None, observer.unavailable
    one = torch.zeros(1, 2, 1, 8)

    def build(self: Keeper) -> None:
        per_cache = args.layers // 100
        for _ in range(100):
            cache = DynamicCache()
            for layer in range(per_cache):
                cache.update(one, one, layer)
            self.caches.append(cache)

    owner(build)
    timed = TimedLock(hooks.lock)
    hooks.lock = timed  # type: ignore[assignment]
    walls = []
    for _ in range(args.samples):
        started = time.perf_counter()
        (figures,) = observer.sample()
        walls.append(time.perf_counter() - started)
    assert figures.available and figures.live_bytes == args.layers * 2 * one.nbytes, figures
    holds = timed.holds.get("MainThread", [])
    print(f"torch {torch.__version__}, {args.layers} live layers, {args.samples} samples")
    print(f"sample wall time (median): {statistics.median(walls) * 1e3:.1f} ms")
    holds.sort()
    print(
        f"lock holds per sample: {len(holds) / args.samples:.0f}; longest hold: {holds[-1] * 1e6:.0f} us, "
        f"99th percentile {holds[int(len(holds) * 0.99) - 1] * 1e6:.0f} us, median {statistics.median(holds) * 1e6:.0f} us"
    )

    reused = DynamicCache()
    reused.update(one, one, 0)
    layer = reused.layers[0]
    base_k, base_v = layer.keys, layer.values

    def update_loop(stop: threading.Event, worst: list[float]) -> None:
        def step(self: Keeper) -> None:
            layer.keys, layer.values = base_k, base_v
            reused.update(one, one, 0)

        while not stop.is_set():
            started = time.perf_counter()
            owner(step)
            worst[0] = max(worst[0], time.perf_counter() - started)

    for label, sampling in (("no sample running", False), ("samples running", True)):
        stop, worst = threading.Event(), [0.0]
        model = threading.Thread(target=update_loop, args=(stop, worst), name="model")
        model.start()
        deadline = time.perf_counter() + 2.0
        while time.perf_counter() < deadline:
            if sampling:
                observer.sample()
            else:
                time.sleep(0.01)
        stop.set()
        model.join()
        waits = timed.waits.pop("model", [0.0])
        print(
            f"{label}: longest model-thread update {worst[0] * 1e3:.1f} ms (with waiting for the GIL), "
            f"longest wait for the hooks' lock {max(waits) * 1e3:.2f} ms over {len(waits)} acquisitions"
        )
    hooks.lock = timed.inner
    observer.uninstall()


if __name__ == "__main__":
    with recorded("observe_sample", "--record" in sys.argv[1:]):
        main()
