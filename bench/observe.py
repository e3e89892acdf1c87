"""What observing model-local KV costs on the model's hot path: with and without, side by side, in one run.

Per call: a cache update of each layer kind, the first update of a new cache (a new layer registered
with the running owner), an outermost call into an owner, a deep copy of a sliding-window cache
(layer creations), and one forward of the smallest demo owner. The demo
owners have no forward of their own; each gets one here: one decode step of a transformers
``Qwen2Model`` with the owner's attention geometry, dtype and cache (its own ``build_cache``).
A *host-bound proxy* of the smallest owner keeps its layers and cache kind but shrinks every
width to almost nothing: its forward is nearly all Python and dispatch, which is roughly the host
side of the same forward on a GPU, where the hooks' share is largest.

Two measures:
- CPU time (``time.process_time``, one torch thread): the minimum over repetitions, with and
  without observation interleaved (install, measure, uninstall). Whole forwards on a shared
  machine move by more than the hooks cost, so their "added" column is noise; the per-call rows
  and the instruction counts carry the conclusions.
- Instructions (``valgrind --tool=callgrind``): the script runs itself under callgrind with
  instrumentation off, and a 6-line C helper (compiled here with ``cc`` against valgrind's
  ``callgrind.h``) zeroes and dumps the counters around each case, off then on, in one process.
  An empty region is the baseline subtracted from the per-call loops.

    .venv/bin/python -m bench.observe              # both (about 10 minutes, 6 of them under valgrind)
    .venv/bin/python -m bench.observe --no-callgrind
    .venv/bin/python -m bench.observe --before TREE  # TREE's bench first, then this tree's, side by side

``--before TREE`` runs another checkout's bench (a ``git worktree`` or ``git archive`` of an older commit, which
imports its own package; ``python -m bench.observe`` from its root, or ``bench/observe.py`` in a tree from before the
testbed) in a subprocess with the same options, then this tree's, and prints each
case's hook cost of both: the instructions are the figures to compare; CPU times are each run's own minimum.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache, Qwen2Config, Qwen2Model, StaticCache

from bench.regions import load_helper, region_totals
from modelkv_exporter.demo import owners as demo
from modelkv_exporter.engine.observe import hooks, install
from modelkv_testbed.bench_tables import RECORD_HELP, recorded

ROOT = Path(__file__).resolve().parent.parent
torch.set_num_threads(1)
OWNERS = (demo.CodecDecoder, demo.LocalTransformer, demo.TalkerGenerator, demo.WhisperStreamingEncoder)
FFN = {"CodecDecoder": 3072, "LocalTransformer": 4096, "TalkerGenerator": 4864, "WhisperStreamingEncoder": 4096}
LOOP = 50
"""Calls per callgrind loop region."""


def twin_config(owner: demo.DemoOwner, shrink: bool) -> Qwen2Config:
    """A Qwen2Config with the owner's attention geometry (Whisper's encoder mapped onto it)."""
    c = owner.config
    if isinstance(owner, demo.WhisperStreamingEncoder):
        layers, heads, kv_heads, hidden = (
            c.encoder_layers,
            c.encoder_attention_heads,
            c.encoder_attention_heads,
            c.d_model,
        )
    else:
        layers, heads, kv_heads, hidden = (
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.hidden_size,
        )
    sliding: dict[str, Any] = {}
    if getattr(c, "use_sliding_window", False):
        sliding = {"sliding_window": c.sliding_window, "use_sliding_window": True, "layer_types": list(c.layer_types)}
    ffn = next(v for k, v in FFN.items() if any(k == b.__name__ for b in type(owner).__mro__))
    if shrink:
        heads, kv_heads, hidden, ffn = 2, 2, 16, 16
    return Qwen2Config(
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        hidden_size=hidden,
        intermediate_size=ffn,
        vocab_size=16,
        **sliding,
    )


def with_forward(base: type[demo.DemoOwner], shrink: bool = False) -> Any:
    """A demo owner with a forward: one decode step over its first declared cache."""

    class Forward(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.model = Qwen2Model(twin_config(self, shrink)).to(self.dtype).eval()
            spec = self.model_local_kv_specs()[0]
            self.spec = dataclasses.replace(spec, kv_heads=2, head_dim=8) if shrink else spec
            self.reset_cache()

        def reset_cache(self) -> None:
            cache = self.build_cache(self.spec, 1)
            self.cache = getattr(cache, "self_attention_cache", cache)
            self.position = int(self.cache.get_seq_length())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                position = torch.tensor([self.position])
                out = self.model(
                    inputs_embeds=x,
                    past_key_values=self.cache,
                    use_cache=True,
                    cache_position=position,
                    position_ids=position[None],
                )
            self.position += 1
            return out.last_hidden_state

    Forward.__name__ = Forward.__qualname__ = base.__name__ + ("HostProxy" if shrink else "")
    return Forward()


def inputs_for(owner: Any) -> torch.Tensor:
    return torch.randn(1, 1, owner.model.config.hidden_size, dtype=owner.dtype)


class CaseOwner(torch.nn.Module):
    """An owner whose forward runs one case, so every case runs inside one owner call."""

    def model_local_kv_specs(self) -> list[Any]:
        return []

    def forward(self, run: Callable[[], Any]) -> Any:
        return run()


def per_call_cases() -> dict[str, Callable[[], Any]]:
    """Stateless callables: each does the same work every time it is called."""
    heads, dim = 16, 64
    one = torch.randn(1, heads, 1, dim)
    base_k, base_v = torch.randn(1, heads, 64, dim), torch.randn(1, heads, 64, dim)
    dynamic = DynamicCache()
    dynamic.update(base_k, base_v, 0)
    dynamic_layer = dynamic.layers[0]
    sliding = Qwen2Config(
        num_hidden_layers=8,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        hidden_size=heads * dim,
        sliding_window=72,
        use_sliding_window=True,
        layer_types=["sliding_attention"] * 8,
    )
    window = DynamicCache(config=sliding)
    for layer in range(8):
        window.update(torch.randn(1, heads, 71, dim), torch.randn(1, heads, 71, dim), layer)
    full = Qwen2Config(
        num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=heads, hidden_size=heads * dim
    )
    static = StaticCache(config=full, max_cache_len=4096)
    static.update(one, one, 0)
    static_layer = static.layers[0]

    def dynamic_update() -> Any:  # always 64 -> 65 positions
        dynamic_layer.keys, dynamic_layer.values = base_k, base_v
        return dynamic.update(one, one, 0)

    def static_update() -> Any:  # always position 1
        static_layer.cumulative_length.fill_(1)
        return static.update(one, one, 0)

    return {
        "first update of a new DynamicCache (a new layer)": lambda: DynamicCache().update(one, one, 0),
        "DynamicLayer.update (64 -> 65 positions)": dynamic_update,
        "DynamicSlidingWindowLayer.update (71 + 1)": lambda: window.update(one, one, 0),
        "StaticLayer.update (1 position)": static_update,
        "owner call (nothing inside)": lambda: None,
        "deepcopy of an 8-layer sliding cache": lambda: copy.deepcopy(window),
    }


def cpu_seconds(run: Callable[[], Any], number: int) -> float:
    for _ in range(min(number, 20)):
        run()
    started = time.process_time()
    for _ in range(number):
        run()
    return (time.process_time() - started) / number


def cpu_time(repetitions: int) -> dict[str, Any]:
    """Per-call and per-forward CPU seconds, off and on, minimum over interleaved repetitions."""
    cases = per_call_cases()
    case_owner = CaseOwner()
    forwards = [with_forward(cls) for cls in OWNERS] + [with_forward(demo.CodecDecoder, shrink=True)]
    inputs = {type(o).__name__: inputs_for(o) for o in forwards}
    result: dict[str, dict[str, float]] = {}
    for repetition in range(repetitions):
        for phase in ("off", "on"):
            observer = None
            if phase == "on":
                owners = [(type(o).__name__, o) for o in forwards] + [("case", case_owner)]
                observer = install(owners, enabled=True)
                assert observer.unavailable is None, observer.unavailable
            for name, run in cases.items():
                number = 100 if "deepcopy" in name else 4000
                slot = result.setdefault(name, {"off": float("inf"), "on": float("inf")})
                slot[phase] = min(slot[phase], cpu_seconds(lambda run=run: case_owner(run), number))
            for owner in forwards:
                name = type(owner).__name__
                large = not name.endswith(("HostProxy", "CodecDecoder"))
                if large and repetition >= 2:
                    continue
                owner.reset_cache()
                x = inputs[name]
                number = 50 if name.endswith("HostProxy") else (1 if large else 5)
                slot = result.setdefault(f"forward {name}", {"off": float("inf"), "on": float("inf")})
                slot[phase] = min(slot[phase], cpu_seconds(lambda owner=owner, x=x: owner(x), number))
            if observer is not None:
                observer.uninstall()
    return result


def callgrind_regions(library: str) -> None:
    """The child under valgrind: every region off, then on, each zeroed and dumped with its label."""
    helper = load_helper(library)
    cases = per_call_cases()
    case_owner = CaseOwner()
    decoder = with_forward(demo.CodecDecoder)
    proxy = with_forward(demo.CodecDecoder, shrink=True)
    x, x_proxy = inputs_for(decoder), inputs_for(proxy)

    def region(label: str, body: Callable[[], Any], prepare: Callable[[], Any] | None = None) -> None:
        for _ in range(2):
            if prepare is not None:
                prepare()
            gc.collect()
            helper.mkv_zero()
            body()
        helper.mkv_dump(label.encode())

    def loop(run: Callable[[], Any]) -> Callable[[], None]:
        def body() -> None:
            for _ in range(LOOP):
                case_owner(run)

        return body

    helper.mkv_start()
    for phase in ("off", "on"):
        observer = None
        if phase == "on":
            observer = install([("CodecDecoder", decoder), ("proxy", proxy), ("case", case_owner)], enabled=True)
            assert observer.unavailable is None, observer.unavailable
        region(f"{phase}|empty|{LOOP}", lambda: None)
        for name, run in cases.items():
            region(f"{phase}|{name}|{LOOP}", loop(run))
        region(f"{phase}|forward CodecDecoder|2", lambda: [decoder(x) for _ in range(2)], decoder.reset_cache)
        region(
            f"{phase}|forward CodecDecoderHostProxy|5", lambda: [proxy(x_proxy) for _ in range(5)], proxy.reset_cache
        )
        if observer is not None:
            observer.uninstall()


def instructions() -> dict[str, dict[str, float]] | str:
    """Instructions per call of every region, off and on; a sentence when callgrind cannot run here."""
    counts = region_totals("bench.observe")
    if isinstance(counts, str):
        return counts
    empty = {phase: counts[f"{phase}|empty|{LOOP}"] for phase in ("off", "on")}
    result: dict[str, dict[str, float]] = {}
    for label, count in counts.items():
        phase, name, calls = label.split("|")
        if name != "empty":
            baseline = empty[phase] if int(calls) == LOOP else 0
            result.setdefault(name, {})[phase] = (count - baseline) / int(calls)
    return result


def report(cpu: dict[str, Any], ir: dict[str, dict[str, float]] | str) -> None:
    forwards = {k: v for k, v in cpu.items() if k.startswith("forward ") and not k.endswith("HostProxy")}
    smallest = min(forwards, key=lambda k: forwards[k]["off"])
    proxy = "forward CodecDecoderHostProxy"
    entry = cpu["owner call (nothing inside)"]["on"] - cpu["owner call (nothing inside)"]["off"]
    print(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, 1 torch thread")
    print(f"smallest demo owner forward: {smallest} {forwards[smallest]['off'] * 1e3:.1f} ms; its host-bound proxy ")
    print(f"  (same layers and cache kind, tiny widths): {cpu[proxy]['off'] * 1e6:.0f} us\n")
    print("CPU TIME per call (min over repetitions; every case runs inside one owner call)")
    print(f"{'case':44s} {'off us':>10s} {'on us':>10s} {'added us':>9s} {'hook us':>8s} {'% fwd':>8s} {'% proxy':>8s}")
    for name, r in cpu.items():
        added = (r["on"] - r["off"]) * 1e6
        if name.startswith("forward "):
            print(f"{name:44s} {r['off'] * 1e6:10.1f} {r['on'] * 1e6:10.1f} {added:9.1f}   (whole forward: noise)")
            continue
        hook = added if name.startswith("owner call") else added - entry * 1e6
        share = hook / (forwards[smallest]["off"] * 1e6) * 100
        print(
            f"{name:44s} {r['off'] * 1e6:10.2f} {r['on'] * 1e6:10.2f} {added:9.2f} {hook:8.2f} "
            f"{share:7.3f}% {hook / (cpu[proxy]['off'] * 1e6) * 100:7.3f}%"
        )
    if isinstance(ir, str):
        print(f"\nINSTRUCTIONS: skipped ({ir})")
        return
    print("\nINSTRUCTIONS per call (callgrind; empty-region baseline subtracted; off and on in one process)")
    entry_ir = ir["owner call (nothing inside)"]["on"] - ir["owner call (nothing inside)"]["off"]
    forward, host = ir["forward CodecDecoder"]["off"], ir["forward CodecDecoderHostProxy"]["off"]
    print(f"{'case':44s} {'off':>12s} {'on':>12s} {'added':>9s} {'hook':>9s} {'% fwd':>8s} {'% proxy':>8s}")
    for name, r in ir.items():
        added = r["on"] - r["off"]
        hook = added if name.startswith(("owner call", "forward")) else added - entry_ir
        print(
            f"{name:44s} {r['off']:12.0f} {r['on']:12.0f} {added:9.0f} {hook:9.0f} "
            f"{hook / forward * 100:7.3f}% {hook / host * 100:7.3f}%"
        )


def hook_costs(figures: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each case's added cost, less the owner call every per-call case runs inside (as ``report`` computes it)."""
    entry = figures["owner call (nothing inside)"]["on"] - figures["owner call (nothing inside)"]["off"]
    return {
        name: r["on"] - r["off"] - (0 if name.startswith(("owner call", "forward")) else entry)
        for name, r in figures.items()
    }


def run_before(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The other tree's own bench, with this run's options, in a subprocess; its figures."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "before.json"
        entry = ["-m", "bench.observe"] if (tree / "testbed").is_dir() else [str(tree / "bench" / "observe.py")]
        command = [sys.executable, *entry, "--repetitions", str(args.repetitions)]
        command += ["--json", str(out)] + (["--no-callgrind"] if args.no_callgrind else [])
        print(f"BEFORE: {tree}", flush=True)
        subprocess.run(command, cwd=tree, check=True)
        print(f"\nAFTER: {ROOT}", flush=True)
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def compare(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Each case's hook cost in the other tree and this one, instructions first."""
    print("\nBEFORE AND AFTER: hook cost per call (instructions; CPU us, each run's own minimum)")
    print(f"{'case':44s} {'ir before':>10s} {'ir after':>10s} {'change':>8s} {'us before':>10s} {'us after':>9s}")
    cpu_before, cpu_after = hook_costs(before["cpu_seconds"]), hook_costs(after["cpu_seconds"])
    ir_ok = all(isinstance(f["instructions"], dict) for f in (before, after))
    ir_before = hook_costs(before["instructions"]) if ir_ok else {}
    ir_after = hook_costs(after["instructions"]) if ir_ok else {}
    for name in cpu_after:
        if name not in cpu_before:
            continue
        ir = "" if name not in ir_after or name not in ir_before else f"{ir_before[name]:10.0f} {ir_after[name]:10.0f}"
        change = f"{(ir_after[name] / ir_before[name] - 1) * 100:+7.1f}%" if ir and ir_before[name] else ""
        print(f"{name:44s} {ir:21s} {change:>8s} {cpu_before[name] * 1e6:10.2f} {cpu_after[name] * 1e6:9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--no-callgrind", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--before", type=Path, help="another checkout, measured first with the same options")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        callgrind_regions(args.child)
        return
    before = run_before(args.before.resolve(), args) if args.before else None
    torch.manual_seed(0)
    cpu = cpu_time(args.repetitions)
    ir = "turned off (--no-callgrind)" if args.no_callgrind else instructions()
    report(cpu, ir)
    figures = {"cpu_seconds": cpu, "instructions": ir}
    if before is not None:
        compare(before, figures)
    if args.json:
        args.json.write_text(json.dumps({**figures, **({"before": before} if before else {})}, indent=2))
    assert not hooks.records, "every observer was uninstalled"


if __name__ == "__main__":
    with recorded("observe", "--record" in sys.argv[1:]):
        main()
