"""Engine start time and generation throughput with and without the plugin, side by side.

Each round starts a fresh vLLM (CPU) engine on a tiny local Qwen2 twice, once with
the plugin active (MODELKV_SPOOL_DIR set, 1 s sampling) and once without it
(VLLM_PLUGINS lists every other installed plugin), alternating which goes first.

Throughput is the median of three timed generations after one warm-up generation.

    python -m bench.engine_overhead [--rounds 4] [--prompts 16] [--tokens 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import entry_points
from pathlib import Path

from modelkv_testbed.bench_tables import RECORD_HELP, recorded

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
if __name__ == "__main__":
    started = time.perf_counter()
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], load_format="dummy", max_model_len=256, enforce_eager=True,
              dtype="float32", max_num_seqs=int(sys.argv[2]))
    start_s = time.perf_counter() - started
    params = SamplingParams(max_tokens=int(sys.argv[3]), ignore_eos=True)
    prompts = ["the quick brown fox jumps over"] * int(sys.argv[2])
    llm.generate(prompts, params, use_tqdm=False)
    rates = []
    for _ in range(3):
        begun = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - begun
        rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed)
    rates.sort()
    print("RESULT " + json.dumps({"start_s": start_s, "tokens_per_s": rates[1]}), flush=True)
"""


def run(model: Path, prompts: int, tokens: int, with_plugin: bool, spool: Path) -> dict[str, float]:
    others = [e.name for e in entry_points(group="vllm.general_plugins") if e.name != "modelkv_exporter"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELKV_")}
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    if with_plugin:
        env.update(MODELKV_SPOOL_DIR=str(spool), MODELKV_SAMPLE_INTERVAL="1")
    else:
        env["VLLM_PLUGINS"] = ",".join(others)
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(prompts), str(tokens)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(result.stdout[-2000:] + result.stderr[-4000:])
    if with_plugin and not list(spool.glob("*.json")):
        raise RuntimeError("the plugin published nothing")
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    from modelkv_testbed.tiny_model import make_tiny_qwen2

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_qwen2(Path(tmp) / "model")
        results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for round_ in range(args.rounds):
            order = (True, False) if round_ % 2 == 0 else (False, True)
            for with_plugin in order:
                spool = Path(tmp) / f"spool-{round_}"
                spool.mkdir(exist_ok=True)
                started = time.monotonic()
                result = run(model, args.prompts, args.tokens, with_plugin, spool)
                results[with_plugin].append(result)
                label = "with" if with_plugin else "without"
                print(
                    f"round {round_} {label:7} start {result['start_s']:6.1f} s  "
                    f"{result['tokens_per_s']:7.1f} tok/s  ({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    print()
    print("| round | start, with (s) | start, without (s) | tok/s, with | tok/s, without |\n|---|---:|---:|---:|---:|")
    for round_, (on, off) in enumerate(zip(results[True], results[False], strict=True)):
        print(
            f"| {round_} | {on['start_s']:.1f} | {off['start_s']:.1f} | {on['tokens_per_s']:.1f} | {off['tokens_per_s']:.1f} |"
        )
    medians = {
        (with_plugin, figure): statistics.median(r[figure] for r in results[with_plugin])
        for with_plugin in (True, False)
        for figure in ("start_s", "tokens_per_s")
    }
    print(
        f"| **median** | **{medians[True, 'start_s']:.2f}** | **{medians[False, 'start_s']:.2f}** "
        f"| **{medians[True, 'tokens_per_s']:.1f}** | **{medians[False, 'tokens_per_s']:.1f}** |"
    )
    start_ratio = medians[True, "start_s"] / medians[False, "start_s"]
    tput_ratio = medians[True, "tokens_per_s"] / medians[False, "tokens_per_s"]
    print(f"ratio with/without: start {start_ratio:.3f}, throughput {tput_ratio:.3f}")


if __name__ == "__main__":
    with recorded("engine_overhead", "--record" in sys.argv[1:]):
        main()
