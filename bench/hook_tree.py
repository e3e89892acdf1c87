"""How long the in-engine hook spends on a big model: collecting, resolving and snapshotting.

A 10,000-module tree (the size of a large omni model's module graph) with three
declarers deep inside, timed alone, then side by side, interleaved, against
vLLM-Omni's own ``collect_model_local_kv_specs`` on the same tree (which only
collects; its 250 ms passes leave the caches cold for ours, hence both figures).

    python -m bench.hook_tree [--modules 10000] [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from torch import nn

from modelkv_exporter.demo.owners import CodecDecoder, TalkerGenerator
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_exporter.protocol import collect_declarations
from modelkv_testbed.bench_tables import RECORD_HELP, recorded


def big_tree(modules: int) -> nn.Module:
    """``modules`` leaf modules in 100-wide blocks, with declarers hidden among them."""
    root = nn.Module()
    blocks = nn.ModuleList()
    per_block = 100
    for start in range(0, modules, per_block):
        blocks.append(nn.ModuleList(nn.Identity() for _ in range(min(per_block, modules - start))))
    root.blocks = blocks
    blocks[len(blocks) // 2].append(CodecDecoder())
    blocks[-1].append(TalkerGenerator())
    root.talker = nn.Sequential(nn.Identity(), CodecDecoder())
    return root


def timed(function: Callable[[], object], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        function()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    parser.add_argument("--modules", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()

    from vllm_omni.model_executor.models.model_local_kv import collect_model_local_kv_specs as omni_collect

    model = big_tree(args.modules)
    count = sum(1 for _ in model.modules())
    runs: dict[str, list[float]] = {
        "ours alone: collect": timed(lambda: collect_declarations(model).specs, args.rounds),
        "ours interleaved: collect": [],
        "ours interleaved: collect + resolve + snapshot": [],
        "vLLM-Omni interleaved: collect": [],
    }
    for _ in range(args.rounds):
        runs["ours interleaved: collect"] += timed(lambda: collect_declarations(model).specs, 1)
        runs["ours interleaved: collect + resolve + snapshot"] += timed(
            lambda: build_snapshot(model, max_num_seqs=8, engine_id="bench"), 1
        )
        runs["vLLM-Omni interleaved: collect"] += timed(lambda: omni_collect(model), 1)
    assert len(collect_declarations(model).specs) == len(omni_collect(model)) == 7
    print(f"module tree: {count} modules, 7 declarations, {args.rounds} interleaved rounds")
    print("| what | median ms | p90 ms | min ms |\n|---|---:|---:|---:|")
    for name, samples in runs.items():
        p90 = statistics.quantiles(samples, n=10)[-1]
        print(f"| {name} | {statistics.median(samples):.2f} | {p90:.2f} | {min(samples):.2f} |")
    ours = statistics.median(runs["ours interleaved: collect"])
    theirs = statistics.median(runs["vLLM-Omni interleaved: collect"])
    print(f"ratio ours/vllm-omni (collect): {ours / theirs:.2f}")


if __name__ == "__main__":
    with recorded("hook_tree", "--record" in sys.argv[1:]):
        main()
