"""What an owner method's wrapper costs per call, beside the same method unwrapped, in one run.

Cases (each method does nothing but return, so the figure is the wrapper's own): a plain method of an
unobserved instance of a wrapped class and of the observed owner; a generator's step (``next``) and a
coroutine's whole call (driven by ``send``, no event loop), observed. Each is measured unwrapped in the same run.
CPU time: the minimum over repetitions of ``CALLS`` calls, in ns a call. Instructions: under callgrind
(``bench.regions``), ``LOOP`` calls a region, an empty loop subtracted.

    .venv/bin/python -m bench.owner_wrappers [--no-callgrind]

In a tree from before ``observe/wrappers.py`` it wraps with ``hooks.wrap_owner_method`` (copy this file into
that tree's ``bench/`` and run it from its root).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from bench.regions import load_helper, region_totals
from modelkv_exporter.engine.observe import hooks, install

try:
    from modelkv_exporter.engine.observe.wrappers import wrap_owner_method
except ImportError:  # a tree from before the wrappers module
    wrap_owner_method = hooks.wrap_owner_method  # type: ignore[attr-defined]

CALLS = 20_000
REPEATS = 15
LOOP = 200


class Plain(torch.nn.Module):
    def model_local_kv_specs(self) -> list[object]:
        return []

    def forward(self, x: int) -> int:
        return x

    def generate(self, steps: int) -> Iterator[int]:
        yield from range(steps)

    async def run(self, x: int) -> int:
        return x


class Wrapped(Plain):
    """The same methods, wrapped as the observer wraps them."""


for _name in ("forward", "generate", "run"):
    setattr(Wrapped, _name, wrap_owner_method(getattr(Plain, _name)))


def drive(coroutine: Any) -> Any:
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the coroutine suspended")


def cases() -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Each case: (unwrapped, wrapped) bodies of one call, with the owner observed."""
    plain, owner, other = Plain(), Wrapped(), Wrapped()
    observer = install([], enabled=True)
    observer.add_owners([("owner", owner)])
    plain_steps = plain.generate(10**9)
    owner_steps = owner.generate(10**9)
    return {
        "plain call, unobserved instance": (lambda: plain.forward(1), lambda: other.forward(1)),
        "plain call, observed owner": (lambda: plain.forward(1), lambda: owner.forward(1)),
        "generator step, observed owner": (lambda: next(plain_steps), lambda: next(owner_steps)),
        "coroutine call, observed owner": (lambda: drive(plain.run(1)), lambda: drive(owner.run(1))),
    }


def per_call_ns(body: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter_ns()
        for _ in range(CALLS):
            body()
        best = min(best, time.perf_counter_ns() - start)
    return best / CALLS


def child(library: str) -> None:
    helper = load_helper(library)
    found = cases()
    helper.mkv_start()

    def region(label: str, body: Callable[[], Any]) -> None:
        for _ in range(LOOP):
            body()
        helper.mkv_zero()
        for _ in range(LOOP):
            body()
        helper.mkv_dump(label.encode())

    region("empty", lambda: None)
    for name, (unwrapped, wrapped) in found.items():
        region(f"{name}|unwrapped", unwrapped)
        region(f"{name}|wrapped", wrapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--no-callgrind", action="store_true")
    options = parser.parse_args()
    if options.child:
        child(options.child)
        return
    result: dict[str, dict[str, float]] = {}
    for name, (unwrapped, wrapped) in cases().items():
        off, on = per_call_ns(unwrapped), per_call_ns(wrapped)
        result[name] = {"unwrapped ns": round(off, 1), "wrapped ns": round(on, 1), "added ns": round(on - off, 1)}
    if not options.no_callgrind:
        totals = region_totals("bench.owner_wrappers")
        if isinstance(totals, str):
            print(totals, file=sys.stderr)
        else:
            empty = totals["empty"]
            for name in result:
                off = (totals[f"{name}|unwrapped"] - empty) / LOOP
                on = (totals[f"{name}|wrapped"] - empty) / LOOP
                result[name].update(
                    {"unwrapped instr": round(off), "wrapped instr": round(on), "added instr": round(on - off)}
                )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
