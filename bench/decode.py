"""What decoding one snapshot costs the sidecar: this tree's decoder beside an earlier one, in one run.

Builds a valid snapshot just under the sidecar's 256 KiB file limit (declarations, observations,
dropped declarations and measured samples, every field filled), checks that both decoders read
it to the same ``Snapshot``, then times them interleaved (so the machine's noise hits both
alike) and prints each one's median and the ratio. The earlier decoder is read from git
(``--before``, a revision; its module path is found there) and runs against this tree's
dataclasses, so only the decoding differs. ``--encode`` times ``Snapshot.to_json`` the same way, beside the revision's own
dataclasses and encoder (both must write the same bytes).
``--callgrind`` runs each decoder once more under valgrind and prints instruction counts.

    python -m bench.decode [--before REV] [--rounds 200] [--callgrind]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from modelkv_exporter.contract.snapshot import DroppedDeclaration, Snapshot
from modelkv_testbed.bench_tables import RECORD_HELP, recorded
from modelkv_testbed.snapshots import make_declaration, make_observation, make_snapshot

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 256 * 1024
"""The sidecar's default ``--max-snapshot-bytes``."""

DECODER_PATHS = ("modelkv_exporter/sidecar/reader/decode.py", "modelkv_exporter/contract/decode.py")
"""Where a revision keeps its decoder, newest layout first."""


def largest_snapshot() -> bytes:
    """The JSON of a valid snapshot as close under ``LIMIT`` as whole declarations get it."""

    def build(count: int) -> Snapshot:
        snapshot = make_snapshot(
            "bench-engine",
            declarations=tuple(make_declaration(f"cache_{i}", owner=f"model.layers.{i % 40}") for i in range(count)),
            interval=5.0,
            measured={f"source_{i}": 1 << 30 for i in range(12)},
            baseline={f"source_{i}": 1 << 29 for i in range(12)},
            observations=tuple(make_observation(f"model.layers.{i}") for i in range(40)),
        )
        dropped = tuple(
            DroppedDeclaration(f"model.extra.{i}", "Extra", "declarer_raised", 1, "KeyError: 'x'") for i in range(8)
        )
        return replace(snapshot, dropped_declarations=dropped)

    count = 1
    while len(build(count * 2).to_json()) < LIMIT:
        count *= 2
    step = count // 2
    while step:
        if len(build(count + step).to_json()) < LIMIT:
            count += step
        step //= 2
    return build(count).to_json()


def decoder_at(revision: str) -> tuple[str, Callable[[bytes], Snapshot]]:
    """``parse_snapshot`` as a revision wrote it, run against this tree's modules."""
    for path in DECODER_PATHS:
        shown = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            module = types.ModuleType(f"decode_at_{revision}")
            exec(compile(shown.stdout, f"{revision}:{path}", "exec"), module.__dict__)
            return path, module.parse_snapshot
    raise SystemExit(f"no decoder at {revision} in {DECODER_PATHS}")


def snapshot_module_at(revision: str) -> types.ModuleType:
    """The snapshot dataclasses as a revision wrote them (with their own ``to_json``)."""
    path = "modelkv_exporter/contract/snapshot.py"
    shown = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True)
    module = types.ModuleType(f"snapshot_at_{revision}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(shown.stdout, f"{revision}:{path}", "exec"), module.__dict__)
    return module


def rebuilt(value: Any, module: types.ModuleType) -> Any:
    """``value`` (this tree's snapshot, or a part of it) as the same instance of ``module``'s classes."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = getattr(module, type(value).__name__)
        return cls(**{f.name: rebuilt(getattr(value, f.name), module) for f in dataclasses.fields(value)})
    if isinstance(value, tuple):
        return tuple(rebuilt(item, module) for item in value)
    return value


def current_decoder() -> Callable[[bytes], Snapshot]:
    """This tree's ``parse_snapshot``."""
    for path in DECODER_PATHS:
        if (ROOT / path).exists():
            return importlib.import_module(path.removesuffix(".py").replace("/", ".")).parse_snapshot
    raise SystemExit(f"no decoder in {DECODER_PATHS}")


def interleaved(functions: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median seconds per call of each function, the functions taking turns in every round."""
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(rounds):
        for name, function in functions.items():
            started = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


SNAPSHOT_FILE = Path("/tmp/modelkv-bench-decode.json")
"""Where the callgrind runs read the snapshot from."""


def instructions(revision: str | None, data: bytes) -> int | None:
    """Instructions of one decode under callgrind: (a run of six decodes - a run of one) / 5, so start-up cancels."""

    def run(decodes: int) -> int | None:
        code = (
            f"import runpy; bench = runpy.run_path({str(Path(__file__).resolve())!r}, run_name='bench')\n"
            f"data = open({str(SNAPSHOT_FILE)!r}, 'rb').read()\n"
            f"decode = bench['decoder_at']({revision!r})[1] if {revision!r} else bench['current_decoder']()\n"
            f"for _ in range({decodes}): decode(data)\n"
        )
        result = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        for line in result.stderr.splitlines():
            if "Collected :" in line:
                return int(line.rsplit(":", 1)[1].strip().replace(",", ""))
        return None

    SNAPSHOT_FILE.write_bytes(data)
    base, one = run(1), run(6)
    return None if base is None or one is None else (one - base) // 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    parser.add_argument("--before", default="HEAD", help="the revision whose decoder is the 'before'")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--encode", action="store_true", help="also time Snapshot.to_json")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions under valgrind")
    args = parser.parse_args()
    data = largest_snapshot()
    path, before = decoder_at(args.before)
    after = current_decoder()
    snapshot = after(data)
    assert before(data) == snapshot, "both decoders must read the document alike"
    print(
        f"snapshot: {len(data):,} bytes (limit {LIMIT:,}), {len(snapshot.declarations)} declarations, "
        f"{len(snapshot.observations)} observations; before: {args.before} ({path})"
    )
    medians = interleaved({"before": lambda: before(data), "after": lambda: after(data)}, args.rounds)
    print("| decoder | median per snapshot | ratio to before |\n|---|---:|---:|")
    for name, median in medians.items():
        print(f"| {name} | {median * 1e3:.2f} ms | {median / medians['before']:.2f} |")
    if args.encode:
        earlier = rebuilt(snapshot, snapshot_module_at(args.before))
        assert earlier.to_json() == snapshot.to_json(), "both encoders must write the same bytes"
        encoded = interleaved({"before": earlier.to_json, "after": snapshot.to_json}, args.rounds)
        print("| encoder (to_json) | median per snapshot | ratio to before |\n|---|---:|---:|")
        for name, median in encoded.items():
            print(f"| {name} | {median * 1e3:.2f} ms | {median / encoded['before']:.2f} |")
    if args.callgrind:
        counts = {"before": instructions(args.before, data), "after": instructions(None, data)}
        print("| decoder | instructions per snapshot (callgrind) | ratio |\n|---|---:|---:|")
        for name, count in counts.items():
            ratio = "" if not count or not counts["before"] else f"{count / counts['before']:.2f}"
            print(f"| {name} | {count:,} | {ratio} |" if count else f"| {name} | not measured | |")


if __name__ == "__main__":
    with recorded("decode", "--record" in sys.argv[1:]):
        main()
