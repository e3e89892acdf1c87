"""What the post-mortem's wrapper costs a worker's step (issue 49), beside the same step unwrapped, in one run.

The step is vLLM's ``Worker.execute_model`` as the hook wraps it (``Registration.patch_worker``: the wrapper that
tells ``ended_by`` what a step raised, then raises it again). Two steps: an empty one (the wrapper's whole cost, in
absolute terms) and one small torch operation (what a step does at the least). Nothing is raised: this is the step
that succeeds, every step of a healthy engine.

    .venv/bin/python -m bench.step_wrapper                 # CPU time, then instructions under callgrind
    .venv/bin/python -m bench.step_wrapper --no-callgrind
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from bench.regions import load_helper, region_totals
from modelkv_exporter.engine.config import HookConfig
from modelkv_exporter.engine.vllm_hook import plugin

torch.set_num_threads(1)
LOOP = 200
SMALL = torch.zeros(16)


class EmptyStep:
    """A worker whose step does nothing."""

    def execute_model(self, scheduler_output: Any) -> Any:
        return scheduler_output


class TorchStep:
    """A worker whose step is one small torch operation."""

    def execute_model(self, scheduler_output: Any) -> Any:
        return torch.add(SMALL, 1.0)


def workers() -> dict[str, tuple[Any, Any]]:
    """Per step: a worker of the class as it is and one of the same class's copy hooked by the plugin."""
    registration = plugin.Registration(HookConfig(tempfile.mkdtemp(prefix="modelkv-bench-"), sample_interval=3600))
    out = {}
    for name, cls in (("empty step", EmptyStep), ("one torch op", TorchStep)):
        hooked = type(cls.__name__, (cls,), dict(vars(cls)))
        registration.patch_worker(SimpleNamespace(Worker=hooked))  # type: ignore[arg-type]
        assert getattr(hooked.execute_model, plugin.MARKER, False), "the step is wrapped"
        out[name] = (cls(), hooked())
    return out


def cpu_seconds(call: Callable[[], Any], repeat: int = 7, number: int = 20_000) -> float:
    """The least CPU time of one call over ``repeat`` runs of ``number`` calls."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(number):
            call()
        best = min(best, (time.process_time() - start) / number)
    return best


def callgrind_regions(library: str) -> None:
    """The child under valgrind: each step ``LOOP`` times, off and on, zeroed and dumped with its label."""
    helper = load_helper(library)
    steps = workers()
    helper.mkv_start()
    for name, (off, on) in {"empty": (None, None), **steps}.items():
        for phase, worker in (("off", off), ("on", on)):
            call = (lambda: None) if worker is None else (lambda worker=worker: worker.execute_model(None))
            for _ in range(2):
                gc.collect()
                helper.mkv_zero()
                for _ in range(LOOP):
                    call()
            helper.mkv_dump(f"{name}|{phase}".encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--no-callgrind", action="store_true")
    args = parser.parse_args()
    if args.child:
        callgrind_regions(args.child)
        return
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, 1 torch thread")
    print("\nCPU TIME per step (min over repetitions)")
    for name, (off, on) in workers().items():
        t_off = cpu_seconds(lambda worker=off: worker.execute_model(None))
        t_on = cpu_seconds(lambda worker=on: worker.execute_model(None))
        print(f"  {name:14s} off {t_off * 1e9:8.0f} ns   on {t_on * 1e9:8.0f} ns   + {(t_on - t_off) * 1e9:6.0f} ns")
    if args.no_callgrind:
        return
    counts = region_totals("bench.step_wrapper")
    if isinstance(counts, str):
        print(f"\nINSTRUCTIONS: {counts}")
        return
    print("\nINSTRUCTIONS per step (callgrind; empty region subtracted)")
    per = {label: (count - counts[f"empty|{label.split('|')[1]}"]) / LOOP for label, count in counts.items()}
    for name in ("empty step", "one torch op"):
        off, on = per[f"{name}|off"], per[f"{name}|on"]
        print(f"  {name:14s} off {off:8.0f}   on {on:8.0f}   + {on - off:6.0f}")


if __name__ == "__main__":
    main()
