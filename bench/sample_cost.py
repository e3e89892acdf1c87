"""What one heartbeat sample costs at 1 000, 10 000 and 30 000 live layers with 10 changed since the last sample:
this tree beside another (``--before DIR``, e.g. a ``git archive`` of the base), in one run.

Each tree runs in a child process of its own (``PYTHONPATH`` at that tree): an observed owner keeps the live layers
(100 a cache, one position each), two samples settle, then seven times: 10 layers are updated in an owner call and
one sample is timed (thread CPU). The minimum and the median are printed, in milliseconds.

    .venv/bin/python bench/sample_cost.py --before /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SIZES = (1_000, 10_000, 30_000)
CHANGED = 10
REPEATS = 7


def child() -> dict[str, list[float]]:
    """In a tree's process: the sample times (seconds) at each size."""
    import torch

    from modelkv_exporter.engine.observe import install
    from modelkv_testbed.hot_path_scenes import keep_layers, kv

    torch.set_num_threads(1)
    one = kv(1, 1)
    out: dict[str, list[float]] = {}
    for layers in SIZES:
        observer = install([], enabled=True)
        owner = keep_layers(observer, layers)
        observer.sample()
        observer.sample()
        caches: list[Any] = owner.kept["caches"]
        times = []
        for repeat in range(REPEATS):

            def change(self: object, repeat: int = repeat, caches: list[Any] = caches) -> None:
                for cache in caches[repeat : repeat + CHANGED]:
                    cache.layers[0].keys, cache.layers[0].values = one, one
                    cache.update(one, one, 0)

            owner(change)
            started = time.thread_time()
            observer.sample()
            times.append(time.thread_time() - started)
        observer.uninstall()
        out[str(layers)] = times
    return out


def run(tree: Path) -> dict[str, list[float]]:
    environment = {**os.environ, "PYTHONPATH": f"{tree}:{tree / 'testbed'}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child"],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--before", type=Path, help="the tree to compare with (its repository root)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child()))
        return
    here = Path(__file__).resolve().parent.parent
    trees = [("before", args.before), ("after", here)] if args.before else [("after", here)]
    results = {name: run(tree) for name, tree in trees}
    print(f"a sample with {CHANGED} layers changed since the last (thread CPU, ms: min / median of {REPEATS})")
    print("| live layers | " + " | ".join(name for name, _ in trees) + " |")
    print("|---:|" + "---:|" * len(trees))
    for layers in SIZES:
        cells = []
        for name, _ in trees:
            times = results[name][str(layers)]
            cells.append(f"{min(times) * 1e3:.2f} / {statistics.median(times) * 1e3:.2f}")
        print(f"| {layers:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
