"""What the hooks cost a model thread, beside the hook off, in one run: CPU time, and instructions under callgrind.

- A new cache layer (``DynamicCache().update``: the layer is built, registered, measured) at stack depth 0, 50 and
  150 frames: inside a declaring owner's call (``declared``), and inside a module discovery attributes it to
  (``discovered``: the walk outward from the layer to the module crosses the frames; it stops at ``MAX_FRAMES``).
- An update of a layer already seen (``DynamicLayer.update``, 64 -> 65 positions).
- 30 000 layers dying at once (10 000 under callgrind): the drop (``list.clear``) and the next update, off and on.
- A model thread updating without pause while a heartbeat samples 10 000 and 30 000 live layers without pause: how
  often and how long it waited for the hooks' lock, and its longest update (GIL waits included: on a shared machine
  they move by more than the hooks cost).

    .venv/bin/python -m bench.hot_path                 # CPU time, waits, then instructions (a few minutes)
    .venv/bin/python -m bench.hot_path --no-callgrind
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from bench.regions import load_helper, region_totals
from modelkv_exporter.engine.config import DiscoverySettings
from modelkv_exporter.engine.discover.discovery import Discovery
from modelkv_exporter.engine.observe import hooks, install

torch.set_num_threads(1)
ONE = torch.zeros(1, 2, 1, 8)
BASE = torch.zeros(1, 2, 64, 8)
DEPTHS = (0, 50, 150)
LOOP = 40
DYING = 10_000
"""Layers dropped at once under callgrind."""


def deep(depth: int, run: Callable[[], Any]) -> Any:
    """``run`` called ``depth`` Python frames further down."""
    return deep(depth - 1, run) if depth > 0 else run()


class Caller(nn.Module):
    """A module whose forward runs what it is handed (as an owner, or a module discovery knows)."""

    def model_local_kv_specs(self) -> list[Any]:
        return []

    def forward(self, run: Callable[[], Any]) -> Any:
        return run()


def new_layer() -> Any:
    return DynamicCache().update(ONE, ONE, 0)


def cases() -> dict[str, Callable[[], Any]]:
    """Each case a callable doing the same work every time, by label; ``owner`` and ``module`` wrap them."""
    layer_cache = DynamicCache()
    layer_cache.update(BASE, BASE, 0)
    layer = layer_cache.layers[0]

    def update() -> Any:
        layer.keys, layer.values = BASE, BASE
        return layer_cache.update(ONE, ONE, 0)

    out: dict[str, Callable[[], Any]] = {"update (64 -> 65 positions)": update}
    for depth in DEPTHS:
        out[f"new layer, depth {depth}"] = lambda depth=depth: deep(depth, new_layer)
    return out


class Setup:
    """The hooks off, on for a declaring owner, or on with discovery in a small model."""

    def __init__(self) -> None:
        self.owner = Caller()
        self.root = nn.Module()
        self.root.block = Caller()
        self.observer: Any = None
        self.discovery: Any = None

    def phase(self, name: str) -> Callable[[Callable[[], Any]], Any]:
        self.close()
        if name == "off":
            return lambda run: self.owner(run)
        self.observer = install([("owner", self.owner)] if name == "declared" else [], enabled=True)
        assert self.observer.unavailable is None, self.observer.unavailable
        if name == "declared":
            return lambda run: self.owner(run)
        self.discovery = Discovery(self.root, DiscoverySettings(census_interval=3600), observer=self.observer)
        self.discovery.start()
        return lambda run: self.root.block(run)

    def close(self) -> None:
        if self.discovery is not None:
            self.discovery.uninstall()
            self.discovery = None
        if self.observer is not None:
            self.observer.uninstall()
            self.observer = None
        getattr(hooks, "changes", []).clear()


def cpu_per_call(run: Callable[[], Any], number: int, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        started = time.process_time()
        for _ in range(number):
            run()
        best = min(best, (time.process_time() - started) / number)
    return best


PHASES = ("off", "declared", "discovered")


def cpu_table() -> dict[str, dict[str, float]]:
    setup = Setup()
    table: dict[str, dict[str, float]] = {}
    for _ in range(2):
        for phase in PHASES:
            call = setup.phase(phase)
            for name, run in cases().items():
                slot = table.setdefault(name, {})
                seconds = cpu_per_call(lambda run=run, call=call: call(run), 400)
                slot[phase] = min(slot.get(phase, float("inf")), seconds)
                getattr(hooks, "changes", []).clear()
    setup.close()
    return table


def dying(call: Callable[[Callable[[], Any]], Any], layers: int) -> tuple[list[Any], Callable[[], Any]]:
    """``layers`` live layers (100 a cache) built in ``call``, and an update in ``call`` of a layer seen before."""
    kept: list[Any] = []

    def build() -> None:
        for _ in range(layers // 100):
            cache = DynamicCache()
            for layer in range(100):
                cache.update(ONE, ONE, layer)
            kept.append(cache)

    call(build)
    reused = DynamicCache()
    call(lambda: reused.update(ONE, ONE, 0))
    gc.collect()
    return kept, lambda: call(lambda: reused.update(ONE, ONE, 0))


def deaths(layers: int = 30_000) -> dict[str, dict[str, float]]:
    """The drop of ``layers`` layers at once, and the update after it, off and on (wall seconds, best of 3)."""
    setup = Setup()
    out: dict[str, dict[str, float]] = {"drop": {}, "next update": {}}
    for phase in ("off", "declared") * 3:
        kept, update = dying(setup.phase(phase), layers)
        started = time.perf_counter()
        kept.clear()
        dropped = time.perf_counter()
        update()
        updated = time.perf_counter()
        for label, seconds in (("drop", dropped - started), ("next update", updated - dropped)):
            out[label][phase] = min(out[label].get(phase, float("inf")), seconds)
    setup.close()
    return out


def waits(layers: int, seconds: float = 2.0) -> dict[str, float]:
    """A model thread updating beside a heartbeat sampling ``layers`` live layers, both without pause."""
    from modelkv_testbed.hot_path_scenes import WaitingLock, keep_layers, sampling, updating

    observer = install([], enabled=True)
    owner = keep_layers(observer, layers)
    started = time.perf_counter()
    observer.sample()
    sample = time.perf_counter() - started
    lock = WaitingLock(hooks.lock)
    hooks.lock = lock  # type: ignore[assignment]
    durations: list[float] = []
    samples = [0]
    sample_once = observer.sample

    def counted() -> Any:
        samples[0] += 1
        return sample_once()

    observer.sample = counted  # type: ignore[method-assign]
    stop = sampling(observer)
    deadline = time.perf_counter() + seconds

    def model() -> None:
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            updating(owner)
            durations.append(time.perf_counter() - began)

    thread = threading.Thread(target=model, name="model")
    thread.start()
    thread.join()
    stop.set()
    time.sleep(0.3)
    hooks.lock = lock.inner
    observer.uninstall()
    model_waits = lock.waits.get("model", [])
    durations.sort()
    return {
        "sample s": sample,
        "samples": samples[0],
        "updates": len(durations),
        "lock waits": len(model_waits),
        "longest lock wait s": max(model_waits, default=0.0),
        "longest update s": durations[-1],
        "p99 update s": durations[int(len(durations) * 0.99)],
    }


def callgrind_regions(library: str) -> None:
    """The child under valgrind: each case ``LOOP`` times per phase, zeroed and dumped with its label."""
    helper = load_helper(library)
    setup = Setup()
    helper.mkv_start()
    for phase in PHASES:
        call = setup.phase(phase)
        for name, run in {"empty": lambda: None, **cases()}.items():
            for _ in range(2):
                gc.collect()
                getattr(hooks, "changes", []).clear()
                helper.mkv_zero()
                for _ in range(LOOP):
                    call(run)
            helper.mkv_dump(f"{phase}|{name}".encode())
        if phase != "discovered":
            kept, update = dying(call, DYING)
            for name, body in (("drop 10 000 layers", kept.clear), ("the update after the drop", update)):
                helper.mkv_zero()
                body()
                helper.mkv_dump(f"{phase}|{name}".encode())
    setup.close()


def instructions() -> dict[str, dict[str, float]] | str:
    counts = region_totals("bench.hot_path")
    if isinstance(counts, str):
        return counts
    table: dict[str, dict[str, float]] = {}
    for label, count in counts.items():
        phase, name = label.split("|")
        if name != "empty":
            once = name.startswith(("drop", "the update after"))
            table.setdefault(name, {})[phase] = count if once else (count - counts[f"{phase}|empty"]) / LOOP
    return table


def print_table(title: str, table: dict[str, dict[str, float]], unit: str, scale: float) -> None:
    print(f"\n{title}")
    print(f"{'case':32s} {'off':>10s} {'declared':>10s} {'+':>8s} {'discovered':>11s} {'+':>8s}")
    for name, row in table.items():
        off = row["off"]
        cells = [f"{off * scale:10.1f}"]
        for phase in ("declared", "discovered"):
            on = row.get(phase)
            cells += [f"{on * scale:10.1f}", f"{(on - off) * scale:8.1f}"] if on is not None else ["-", "-"]
        print(f"{name:32s} {' '.join(cells)}   ({unit})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--no-callgrind", action="store_true")
    args = parser.parse_args()
    if args.child:
        callgrind_regions(args.child)
        return
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, 1 torch thread")
    print_table("CPU TIME per call (min over repetitions)", cpu_table(), "us", 1e6)
    died = deaths()
    print("\n30 000 LAYERS DYING AT ONCE (wall, best of 3)")
    for label, row in died.items():
        print(f"  {label:12s} off {row['off'] * 1e3:8.2f} ms   on {row['declared'] * 1e3:8.2f} ms")
    print("\nA MODEL THREAD UPDATING BESIDE A HEARTBEAT SAMPLING WITHOUT PAUSE (2 s)")
    for layers in (10_000, 30_000):
        w = waits(layers)
        print(
            f"  {layers:6d} live layers: a sample {w['sample s'] * 1e3:.0f} ms, {w['samples']:.0f} samples, "
            f"{w['updates']:.0f} updates; lock waits {w['lock waits']:.0f} (longest {w['longest lock wait s'] * 1e3:.2f}"
            f" ms); longest update {w['longest update s'] * 1e3:.1f} ms, p99 {w['p99 update s'] * 1e3:.2f} ms"
        )
    if not args.no_callgrind:
        ir = instructions()
        if isinstance(ir, str):
            print(f"\nINSTRUCTIONS: {ir}")
        else:
            print_table("INSTRUCTIONS per call (callgrind; empty region subtracted; drops once)", ir, "instructions", 1)


if __name__ == "__main__":
    main()
