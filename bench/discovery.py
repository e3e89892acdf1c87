"""What discovery costs on a 10,000-module model: the census, and attributing cache layers, beside no discovery.

- **Census**: one census of every module's tensors (nothing new found: the usual case), its CPU
  and wall time, its longest slice between two yields, and its share of one core at the default
  census interval (and, for comparison, if it ran at every default heartbeat). The baseline census
  at load (parameters read too) once. Without discovery no census runs: its cost is 0.
- **Attribution**: a ``DynamicCache`` of 2 layers built and filled inside a module 12 modules deep
  in the same model (each layer is first seen there: one walk of the stack), and one update of a
  layer already seen (never a walk), with observation on and discovery off, then on.
- **Engine step**: a decode step of a small transformers ``Qwen2Model`` (2 layers, hidden 256) on
  one CPU thread, as the scale against which a census slice and a census are set.

Two measures, as in ``bench/observe.py``: CPU time (``time.process_time``, minimum over repetitions)
and instructions (``valgrind --tool=callgrind``: the script runs itself under callgrind with
instrumentation off and a small C helper zeroes and dumps the counters around each region).

- **Attribution by stack depth** (``--attribution``): a new cache layer attributed at caller stack depths
  0, 50 and 150, for a cache built inside a module, a cache handed into the model from outside
  (``past_key_values``), and a cache built outside the model; per layer, discovery off then on.
- **Lock holds and slices** (``--attribution``): the longest time a sample holds ``hooks.lock`` with
  10,000 live discovered layers, and the longest census slice (thread CPU) over a module holding a
  1,000,000-element list and one holding a 100,000-key dict.

- **Census cost over many small tensors** (``--census-cost``, ``bench/census_cost.py``): collections, longest
  slice and peak memory of one census over a module holding a million small tensors, a revision's census
  (``--before REV``) beside this tree's, in one run.

    .venv/bin/python -m bench.discovery                 # both (a few minutes under valgrind)
    .venv/bin/python -m bench.discovery --census-cost [--before REV] [--tensors N] [--freeze]
    .venv/bin/python -m bench.discovery --no-callgrind
    .venv/bin/python -m bench.discovery --attribution [--no-callgrind]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, Qwen2Config, Qwen2Model

from bench.regions import load_helper, region_totals
from modelkv_exporter.engine.config import DiscoverySettings, HookConfig
from modelkv_exporter.engine.discover import Discovery, census
from modelkv_exporter.engine.discover.module_map import ModuleMap
from modelkv_exporter.engine.observe import hooks, install
from modelkv_testbed.bench_tables import RECORD_HELP, recorded

ROOT = Path(__file__).resolve().parent.parent
torch.set_num_threads(1)
MODULES = 10_000
DEPTH = 12
HEARTBEAT = HookConfig.__dataclass_fields__["sample_interval"].default
CENSUS_INTERVAL = DiscoverySettings().census_interval


class Block(nn.Module):
    """A transformer-block-like module: 4 projections, a norm, an MLP, a buffer and a few plain attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(8, 8) for _ in range(4))
        self.norm = nn.LayerNorm(8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.register_buffer("inv_freq", torch.zeros(4))
        self.scale, self.head_dim = 0.5, 4


class Nest(nn.Module):
    """``DEPTH`` modules deep; the innermost runs what it is handed."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.inner = Nest(depth - 1) if depth > 1 else None

    def forward(self, run: Callable[[], Any]) -> Any:
        return self.inner(run) if self.inner is not None else run()


def model() -> nn.Module:
    """A model of ``MODULES`` modules: blocks, and one nest of ``DEPTH`` where caches are built."""
    root = nn.Module()
    root.nest = Nest(DEPTH)
    root.layers = nn.ModuleList()
    while sum(1 for _ in root.modules()) < MODULES:
        root.layers.append(Block())
    return root


STATES = torch.zeros(1, 2, 4, 8)


def build_cache() -> DynamicCache:
    cache = DynamicCache()
    for layer in range(2):
        cache.update(STATES, STATES, layer)
    return cache


def cpu_seconds(body: Callable[[], Any], number: int, repeat: int = 7) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        for _ in range(number):
            body()
        best = min(best, (time.process_time() - start) / number)
    return best


def engine_step() -> Callable[[], Any]:
    config = Qwen2Config(
        num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2
    )
    llm = Qwen2Model(config).eval()
    ids = torch.tensor([[1]])
    cache = DynamicCache()
    with torch.no_grad():
        llm(input_ids=torch.tensor([[1] * 32]), past_key_values=cache, use_cache=True)

    def step() -> None:
        with torch.no_grad():
            llm(input_ids=ids, past_key_values=cache, use_cache=True)
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, :32], layer.values[:, :, :32]

    return step


def measure() -> dict[str, Any]:
    root = model()
    observer = install([], enabled=True)
    assert observer.unavailable is None, observer.unavailable
    out: dict[str, Any] = {"modules": sum(1 for _ in root.modules())}
    settings = DiscoverySettings(census_interval=0)
    started = time.process_time()
    found = Discovery(root, settings, observer=observer)
    out["install (module map + baseline census) s"] = time.process_time() - started
    found.start()
    assert found.modules is not None
    walks = []
    for _ in range(7):
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        result = census.run(census.census(found.modules, found.budget))
        walks.append((time.process_time() - cpu, time.perf_counter() - wall, result))
    out["census cpu s"] = min(w[0] for w in walks)
    out["census wall s"] = statistics.median(w[1] for w in walks)
    out["longest slice s"] = max(w[2].longest_slice for w in walks)
    out["objects"] = walks[0][2].objects
    slices: list[float] = []
    for _ in range(7):
        walk = census.census(found.modules, found.budget)
        began = time.thread_time()
        try:
            while True:
                next(walk)
                slices.append(time.thread_time() - began)
                time.sleep(0)
                began = time.thread_time()
        except StopIteration:
            slices.append(time.thread_time() - began)
    out["slices"] = len(slices) // 7
    out["slice p50 s"] = statistics.median(slices)
    out["slice max s"] = max(slices)
    out["sample (census due, nothing found) cpu s"] = cpu_seconds(found.beat, 3)
    attribution: dict[str, dict[str, float]] = {}
    cache = build_cache()
    for phase in ("off", "on"):
        hooks.discover = found.attribute if phase == "on" else None
        attribution.setdefault("build a 2-layer cache 12 modules deep", {})[phase] = cpu_seconds(
            lambda: root.nest(build_cache), 200
        )
        attribution.setdefault("update a layer already seen", {})[phase] = cpu_seconds(
            lambda cache=cache: root.nest(lambda: cache.layers[0].update(STATES, STATES)), 200
        )
        cache = build_cache()
    found.uninstall()
    out["attribution"] = attribution
    step = engine_step()
    out["engine step s"] = cpu_seconds(step, 50)
    observer.uninstall()
    return out


def callgrind_regions(library: str) -> None:
    """The child under valgrind: each region zeroed, run, dumped with its label."""
    helper = load_helper(library)
    root = model()
    observer = install([], enabled=True)
    found = Discovery(root, DiscoverySettings(census_interval=0), observer=observer)
    found.start()
    assert found.modules is not None
    modules = found.modules
    step = engine_step()
    cache = build_cache()

    def region(label: str, body: Callable[[], Any]) -> None:
        gc.collect()
        helper.mkv_zero()
        body()
        helper.mkv_dump(label.encode())

    helper.mkv_start()
    region("empty|1", lambda: None)
    region("census|1", lambda: census.run(census.census(modules, found.budget)))
    region("baseline census|1", lambda: census.run(census.census(modules, found.budget, parameters=True)))
    region("engine step|5", lambda: [step() for _ in range(5)])
    for phase in ("off", "on"):
        hooks.discover = found.attribute if phase == "on" else None
        region(f"{phase} build a 2-layer cache 12 modules deep|20", lambda: [root.nest(build_cache) for _ in range(20)])
        region(
            f"{phase} update a layer already seen|20",
            lambda: [root.nest(lambda: cache.layers[0].update(STATES, STATES)) for _ in range(20)],
        )
    found.uninstall()
    observer.uninstall()


def instructions() -> dict[str, float] | str:
    """Instructions per call of every region; a sentence when callgrind cannot run here."""
    totals = region_totals("bench.discovery")
    if isinstance(totals, str):
        return totals
    counts: dict[str, float] = {}
    for label, total in totals.items():
        name, calls = label.split("|")
        counts[name] = total / int(calls)
    return counts


def report(cpu: dict[str, Any], ir: dict[str, float] | str) -> None:
    census_cpu = cpu["census cpu s"]
    print(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, 1 torch thread")
    print(f"model: {cpu['modules']} modules; a census visits {cpu['modules']} modules and {cpu['objects']} objects\n")
    print("CENSUS (without discovery: none runs, 0)")
    print(f"  one census, CPU                      {census_cpu * 1e3:8.1f} ms")
    print(f"  one census, wall (yields included)   {cpu['census wall s'] * 1e3:8.1f} ms")
    print(f"  a sample with a census due, CPU      {cpu['sample (census due, nothing found) cpu s'] * 1e3:8.1f} ms")
    print(f"  slices: {cpu['slices']} a census; thread CPU a slice: median {cpu['slice p50 s'] * 1e3:.2f} ms, longest")
    print(
        f"    {cpu['slice max s'] * 1e3:.2f} ms (7 censuses); longest wall {cpu['longest slice s'] * 1e3:.2f} ms (includes time"
    )
    print("    the OS took the thread away, which no yield can prevent)")
    print(
        f"  share of one core at the default census interval ({CENSUS_INTERVAL:.0f} s): {census_cpu / CENSUS_INTERVAL:.4%}"
    )
    print(f"  (if it ran at every default heartbeat, {HEARTBEAT:.0f} s: {census_cpu / HEARTBEAT:.4%})")
    print(
        f"  baseline census at load (parameters too) with the module map: {cpu['install (module map + baseline census) s'] * 1e3:.1f} ms once"
    )
    step = cpu["engine step s"]
    print(
        f"\nENGINE STEP (a 2-layer Qwen2 decode step, CPU): {step * 1e3:.2f} ms; a census = {census_cpu / step:.1f} steps,"
    )
    print(f"  spread over {cpu['slices']} slices of at most {cpu['slice max s'] * 1e3:.2f} ms of CPU each\n")
    print("ATTRIBUTION, CPU per call (observation on; discovery off, then on)")
    print(f"{'case':44s} {'off us':>9s} {'on us':>9s} {'added us':>9s}")
    for name, r in cpu["attribution"].items():
        print(f"{name:44s} {r['off'] * 1e6:9.1f} {r['on'] * 1e6:9.1f} {(r['on'] - r['off']) * 1e6:9.1f}")
    if isinstance(ir, str):
        print(f"\nINSTRUCTIONS: not counted ({ir})")
        return
    empty = ir.get("empty", 0)
    print("\nINSTRUCTIONS (callgrind), per call")
    for name in ("census", "baseline census", "engine step"):
        print(f"  {name:42s} {ir[name] - empty:14,.0f}")
    print(f"  census per module                          {(ir['census'] - empty) / cpu['modules']:14,.0f}")
    print(f"{'case':44s} {'off':>12s} {'on':>12s} {'added':>12s}")
    for name in ("build a 2-layer cache 12 modules deep", "update a layer already seen"):
        off, on = ir[f"off {name}"], ir[f"on {name}"]
        print(f"{name:44s} {off:12,.0f} {on:12,.0f} {on - off:12,.0f}")


# -- attribution by stack depth, lock holds, slices over huge containers ---------------------------------

DEPTHS = (0, 50, 150)
PART = "MODELKV_BENCH_PART"


class Keeper(nn.Module):
    """Builds a fresh 2-layer cache in its forward; one instance in the model."""

    def forward(self) -> DynamicCache:
        return build_cache()


class Stack(nn.Module):
    """Handed a cache in ``past_key_values`` and fills 2 layers of it, as a transformers model does; one instance."""

    def forward(self, past_key_values: DynamicCache) -> DynamicCache:
        for layer in range(2):
            past_key_values.update(STATES, STATES, layer)
        return past_key_values


def at_depth(depth: int, body: Callable[[], Any]) -> Any:
    """``body()`` called ``depth`` frames below the caller."""
    return at_depth(depth - 1, body) if depth else body()


def small_model() -> nn.Module:
    root = nn.Module()
    root.keeper = Keeper()
    root.stack = Stack()
    root.blocks = nn.ModuleList(Block() for _ in range(50))
    return root


def depth_cases(root: nn.Module) -> dict[str, Callable[[], Any]]:
    cases: dict[str, Callable[[], Any]] = {}
    for depth in DEPTHS:
        cases[f"built in a module, {depth} frames down"] = lambda d=depth: at_depth(d, root.keeper)
        cases[f"handed into the model, {depth} frames down"] = lambda d=depth: at_depth(
            d, lambda: root.stack(DynamicCache())
        )
        cases[f"built outside the model, {depth} frames down"] = lambda d=depth: at_depth(d, build_cache)
    return cases


class TimedLock:
    """``hooks.lock`` with the longest hold recorded (reentrant; holds by one thread at a time)."""

    def __init__(self) -> None:
        self.inner = threading.RLock()
        self.depth = 0
        self.since = 0.0
        self.cpu_since = 0.0
        self.longest = 0.0
        self.longest_cpu = 0.0
        self.holds = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self.inner.acquire(blocking, timeout)
        if got:
            self.depth += 1
            if self.depth == 1:
                self.since = time.perf_counter()
                self.cpu_since = time.thread_time()
        return got

    def release(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.longest = max(self.longest, time.perf_counter() - self.since)
            self.longest_cpu = max(self.longest_cpu, time.thread_time() - self.cpu_since)
            self.holds += 1
        self.inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holds(layers: int = 10_000) -> dict[str, float]:
    """A sample with ``layers`` live discovered layers: the longest ``hooks.lock`` hold, and a model thread's
    longest wait for one cache update meanwhile."""
    root = small_model()
    observer = install([], enabled=True)
    found = Discovery(root, DiscoverySettings(census_interval=3600), observer=observer)
    found.start()
    kept = [root.keeper() for _ in range(layers // 2)]
    quiet = TimedLock()
    hooks.lock = quiet  # type: ignore[assignment]
    began = time.thread_time()
    found.sample()
    alone = time.thread_time() - began
    timed, original = TimedLock(), hooks.lock
    hooks.lock = timed  # type: ignore[assignment]
    stop = threading.Event()
    waits: list[float] = []
    layer = kept[0].layers[0]

    def model_thread() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            layer.update(STATES, STATES)
            waits.append(time.perf_counter() - began)
            layer.keys, layer.values = STATES, STATES

    thread = threading.Thread(target=model_thread)
    try:
        thread.start()
        began = time.perf_counter()
        for _ in range(5):
            found.sample()
        sample = (time.perf_counter() - began) / 5
    finally:
        stop.set()
        thread.join()
        hooks.lock = original  # type: ignore[assignment]
    found.uninstall()
    observer.uninstall()
    del kept
    return {
        "sample s": sample,
        "sample alone cpu s": alone,
        "longest hold alone s": quiet.longest,
        "longest hold alone cpu s": quiet.longest_cpu,
        "holds": quiet.holds,
        "longest hold s": timed.longest,
        "longest update s": max(waits),
    }


def huge_slices() -> dict[str, dict[str, float]]:
    """The longest census slice (thread CPU) and full collections over one module holding a huge container."""
    out: dict[str, dict[str, float]] = {}
    for name, make in (
        ("a 1,000,000-element list", lambda: [[item] for item in range(1_000_000)]),
        ("a 100,000-key dict", lambda: {item: [item] for item in range(100_000)}),
    ):
        root = nn.Module()
        root.huge = make()
        modules = ModuleMap(root)
        gc.collect()
        longest, full = 0.0, gc.get_stats()[2]["collections"]
        walk = census.census(modules, census.Budget(modules=100_000, objects=500_000, depth=8))
        began = time.thread_time()
        wall = time.perf_counter()
        try:
            while True:
                next(walk)
                longest = max(longest, time.thread_time() - began)
                began = time.thread_time()
        except StopIteration:
            longest = max(longest, time.thread_time() - began)
        out[name] = {
            "longest slice s": longest,
            "census wall s": time.perf_counter() - wall,
            "full collections": gc.get_stats()[2]["collections"] - full,
        }
        del root, modules
    return out


def measure_attribution() -> dict[str, Any]:
    root = small_model()
    observer = install([], enabled=True)
    found = Discovery(root, DiscoverySettings(census_interval=3600), observer=observer)
    found.start()
    timings: dict[str, dict[str, float]] = {}
    for phase in ("off", "on"):
        hooks.discover = found.attribute if phase == "on" else None
        for name, body in depth_cases(root).items():
            timings.setdefault(name, {})[phase] = cpu_seconds(body, 200) / 2
    found.uninstall()
    observer.uninstall()
    return {"attribution": timings, "locks": lock_holds(), "huge": huge_slices()}


def callgrind_attribution(library: str) -> None:
    helper = load_helper(library)
    root = small_model()
    observer = install([], enabled=True)
    found = Discovery(root, DiscoverySettings(census_interval=3600), observer=observer)
    found.start()
    cases = depth_cases(root)
    helper.mkv_start()
    for phase in ("off", "on"):
        hooks.discover = found.attribute if phase == "on" else None
        for name, body in cases.items():
            body()
            gc.collect()
            helper.mkv_zero()
            for _ in range(10):
                body()
            helper.mkv_dump(f"{phase} {name}|20".encode())
    found.uninstall()
    observer.uninstall()


def report_attribution(cpu: dict[str, Any], ir: dict[str, float] | str) -> None:
    print(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, 1 torch thread")
    print("\nATTRIBUTION OF A NEW LAYER, CPU per layer (observation on; discovery off, then on)")
    print(f"{'case':44s} {'off us':>9s} {'on us':>9s} {'added us':>9s}")
    for name, r in cpu["attribution"].items():
        print(f"{name:44s} {r['off'] * 1e6:9.1f} {r['on'] * 1e6:9.1f} {(r['on'] - r['off']) * 1e6:9.1f}")
    if isinstance(ir, str):
        print(f"\nINSTRUCTIONS: not counted ({ir})")
    else:
        print("\nINSTRUCTIONS (callgrind) per layer")
        print(f"{'case':44s} {'off':>12s} {'on':>12s} {'added':>12s}")
        for name in cpu["attribution"]:
            off, on = ir[f"off {name}"], ir[f"on {name}"]
            print(f"{name:44s} {off:12,.0f} {on:12,.0f} {on - off:12,.0f}")
    locks = cpu["locks"]
    print("\nA SAMPLE WITH 10,000 LIVE DISCOVERED LAYERS")
    print(f"  one sample alone, thread CPU            {locks['sample alone cpu s'] * 1e3:9.2f} ms")
    print(f"  holds of hooks.lock in it               {locks['holds']:9.0f}")
    print(
        f"  its longest hold, wall / thread CPU     {locks['longest hold alone s'] * 1e6:9.0f} us / {locks['longest hold alone cpu s'] * 1e6:.0f} us"
    )
    print("  beside a model thread updating a cache without pause:")
    print(f"  one sample, wall                        {locks['sample s'] * 1e3:9.2f} ms")
    print(f"  longest hold of hooks.lock, wall         {locks['longest hold s'] * 1e6:9.0f} us")
    print(
        f"  a model thread's longest cache update   {locks['longest update s'] * 1e3:9.2f} ms (GIL switches included)"
    )
    print("\nA CENSUS OVER ONE HUGE CONTAINER")
    for name, r in cpu["huge"].items():
        print(
            f"  {name:26s} longest slice {r['longest slice s'] * 1e3:8.2f} ms CPU, census {r['census wall s'] * 1e3:8.1f} ms"
            f" wall, {r['full collections']:.0f} full collections"
        )


def main() -> None:
    if "--census-cost" in sys.argv[1:]:
        from bench import census_cost

        sys.argv.remove("--census-cost")
        census_cost.main()
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    parser.add_argument("--no-callgrind", action="store_true", help="CPU time only")
    parser.add_argument("--attribution", action="store_true", help="attribution by depth, lock holds, huge containers")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if os.environ.get(PART) == "attribution":
            callgrind_attribution(args.child)
        else:
            callgrind_regions(args.child)
        return
    if args.attribution:
        cpu = measure_attribution()
        os.environ[PART] = "attribution"
        report_attribution(cpu, "skipped (--no-callgrind)" if args.no_callgrind else instructions())
        return
    cpu = measure()
    report(cpu, "skipped (--no-callgrind)" if args.no_callgrind else instructions())


if __name__ == "__main__":
    with recorded("discovery", "--record" in sys.argv[1:]):
        main()
