"""What a cache layer's death costs the model's thread: 30 000 observed layers dropped at once, hook off and on.

The observed layers' weak references run a callback when their layer dies (``hooks._on_dead``). The hook on is
measured twice in one run: with the callback it has (``deque.append`` itself) and with a Python function that does
the same append (the callback before issue 46), so the two are compared on the same machine at the same moment. CPU
time (``time.process_time``, one torch thread), the minimum over repetitions, interleaved.

    .venv/bin/python -m bench.layer_death
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache

from modelkv_exporter.engine.observe import hooks, install

torch.set_num_threads(1)


class Owner(torch.nn.Module):
    """A declaring owner that builds a cache of ``layers`` layers in one call and keeps it."""

    def forward(self, layers: int) -> DynamicCache:
        cache = DynamicCache()
        states = torch.ones(1, 1, 1, 2)
        for index in range(layers):
            cache.update(states, states, index)
        return cache


def python_on_dead(record: Any) -> None:
    """The callback before issue 46: Python code that queues the record."""
    try:
        hooks.changes.append(record)
    except Exception:  # noqa: BLE001 - as it was
        pass


def drop_seconds(layers: int, observed: bool, callback: Callable[[Any], None] | None) -> float:
    """CPU seconds of dropping one cache of ``layers`` layers (built while the owner runs)."""
    owner = Owner()
    observer = install([], enabled=True) if observed else None
    kept = hooks._on_dead
    if callback is not None:
        hooks._on_dead = callback
    try:
        if observer is not None:
            observer.add_owners([("owner", owner)])
        cache = owner(layers)
        gc.collect()
        gc.disable()
        began = time.process_time()
        del cache
        spent = time.process_time() - began
        gc.enable()
        with hooks.lock:
            hooks.drain()
        return spent
    finally:
        hooks._on_dead = kept
        if observer is not None:
            observer.uninstall()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=5)
    arguments = parser.parse_args()
    cases: dict[str, tuple[bool, Callable[[Any], None] | None]] = {
        "hook off": (False, None),
        "hook on, deque.append (now)": (True, None),
        "hook on, Python callback (before)": (True, python_on_dead),
    }
    best = {name: float("inf") for name in cases}
    for _ in range(arguments.repeat):
        for name, (observed, callback) in cases.items():
            best[name] = min(best[name], drop_seconds(arguments.layers, observed, callback))
    off = best["hook off"]
    print(f"dropping {arguments.layers} observed layers at once, min of {arguments.repeat} (CPU ms):")
    for name, seconds in best.items():
        print(f"  {name:36} {seconds * 1e3:8.1f} ms  ({seconds / off:.2f}x off)")


if __name__ == "__main__":
    main()
