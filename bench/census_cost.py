"""What one census costs over a module holding many small tensors, before and after issue 46, in one run.

The model: one module holding ``--tensors`` one-element tensors in a list (all there at load, so in the baseline:
the usual case, nothing new found), and the same with every tensor new (created after load: the worst case).
For each, the census as a revision's ``Discovery._census`` ran it (``--before``, default ``HEAD``: its
``census.py`` run against this tree's modules) and as this tree runs it (the baseline passed as ``known``, the
tables reused), with the heartbeat's pauses between slices left out:

- collections the collector started during the census (``gc.callbacks``: a count), and of them full ones;
- its longest slice between two yields (thread CPU), and its CPU time;
- the most memory it held at once (``tracemalloc``, in a run of its own).

Without discovery no census runs: 0 for every figure.

    .venv/bin/python -m bench.census_cost [--before REV] [--tensors 1000000] [--freeze]
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
import tracemalloc
import types
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modelkv_exporter.engine.discover import census
from modelkv_exporter.engine.discover.module_map import ModuleMap

ROOT = Path(__file__).resolve().parent.parent
CENSUS_PATH = "modelkv_exporter/engine/discover/census.py"
torch.set_num_threads(1)


def census_at(revision: str) -> types.ModuleType:
    """``census.py`` as a revision wrote it, run against this tree's modules."""
    shown = subprocess.run(
        ["git", "show", f"{revision}:{CENSUS_PATH}"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    module = types.ModuleType(f"census_at_{revision}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(shown.stdout, f"{revision}:{CENSUS_PATH}", "exec"), module.__dict__)
    return module


class Collections:
    """Collections started while installed, and of them full ones (generation 2)."""

    def __init__(self) -> None:
        self.count = self.full = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.count += 1
            self.full += info["generation"] == 2


def sliced(walk: Generator[None, None, Any]) -> tuple[float, float]:
    """Drive a census; its longest slice and its total, in thread CPU seconds."""
    longest = total = 0.0
    began = time.thread_time()
    while True:
        try:
            next(walk)
        except StopIteration:
            break
        spent = time.thread_time() - began
        longest, total = max(longest, spent), total + spent
        began = time.thread_time()
    spent = time.thread_time() - began
    return max(longest, spent), total + spent


def measure(make: Callable[[], Generator[None, None, Any]]) -> dict[str, float]:
    gc.collect()
    counted = Collections()
    gc.callbacks.append(counted)
    try:
        longest, cpu = sliced(make())
    finally:
        gc.callbacks.remove(counted)
    gc.collect()
    tracemalloc.start()
    try:
        sliced(make())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return {"collections": counted.count, "full": counted.full, "longest": longest, "cpu": cpu, "peak": peak}


def compare(
    case: str, before: types.ModuleType, revision: str, budget: census.Budget, tensors: int, freeze: bool
) -> list[tuple[str, dict[str, float]]]:
    """The two censuses over one module holding ``tensors`` small tensors, there at load or all new."""
    root = nn.Module()
    held = [torch.zeros(1) for _ in range(tensors)]
    if case == "all in the baseline":
        root.many = held
    modules = ModuleMap(root)
    baseline = census.run(census.census(modules, budget, parameters=True), pause=False)
    known = {storage for storage, _ in baseline.found.items()} | baseline.parameters
    del baseline
    root.many = held
    del held
    scratch = census.Scratch(budget)
    gc.collect()
    if freeze:
        gc.freeze()
    try:
        return [
            (f"{case}, before ({revision})", measure(lambda: before.census(modules, budget))),
            (f"{case}, after", measure(lambda: census.census(modules, budget, known=known, scratch=scratch))),
        ]
    finally:
        if freeze:
            gc.unfreeze()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="HEAD", help="the revision whose census is the 'before'")
    parser.add_argument("--tensors", type=int, default=1_000_000)
    parser.add_argument("--freeze", action="store_true", help="gc.freeze() after load, as vLLM does")
    args = parser.parse_args()
    before = census_at(args.before)
    budget = census.Budget(modules=100_000, objects=2 * args.tensors + 10, depth=8)
    rows: list[tuple[str, dict[str, float]]] = []
    for case in ("all in the baseline", "all new"):
        rows += compare(case, before, args.before, budget, args.tensors, args.freeze)
    print(
        f"one module holding {args.tensors:,} one-element tensors; torch {torch.__version__}, "
        f"Python {sys.version.split()[0]}{', gc.freeze() after load' if args.freeze else ''}"
    )
    print("| census | collections (full) | longest slice, thread CPU | census CPU | peak memory |")
    print("|---|---:|---:|---:|---:|")
    print("| discovery off | 0 (0) | 0 | 0 | 0 |")
    for name, r in rows:
        print(
            f"| {name} | {r['collections']:.0f} ({r['full']:.0f}) | {r['longest'] * 1e3:.2f} ms | "
            f"{r['cpu']:.2f} s | {r['peak'] / 1e6:.1f} MB |"
        )


if __name__ == "__main__":
    main()
