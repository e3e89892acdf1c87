"""What the engine pays per heartbeat: sample memory, encode the snapshot, fsync, rename.

Times ``SnapshotPublisher.beat(sampler())`` for snapshots of 1, 7 and 100 declarations,
in a directory on disk and in /dev/shm (a memory-medium emptyDir is tmpfs), beside a
peer doing the same write non-atomically (plain ``write_bytes``), and reports the
share of one core the heartbeat takes at the default 5 s and the minimum 1 s interval.

    python -m bench.heartbeat [--beats 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.samplers import sample_host_memory
from modelkv_testbed.bench_tables import RECORD_HELP, recorded
from modelkv_testbed.snapshots import (
    make_declaration,
    make_snapshot,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    parser.add_argument("--beats", type=int, default=300)
    args = parser.parse_args()
    print(
        "| directory | declarations | beat µs | plain write µs | share of a core at 5 s (default) | at 1 s (minimum) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for where in ("disk", "/dev/shm"):
        base = None if where == "disk" else "/dev/shm"
        for count in (1, 7, 100):
            with tempfile.TemporaryDirectory(dir=base) as spool:
                snapshot = make_snapshot("bench", declarations=tuple(make_declaration(f"c{i}") for i in range(count)))
                publisher = SnapshotPublisher(spool, snapshot)
                plain = Path(spool) / "plain.json"
                beats, writes = [], []
                for _ in range(args.beats):
                    started = time.perf_counter()
                    publisher.beat(sample_host_memory())
                    beats.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    plain.write_bytes(publisher.snapshot.to_json())
                    writes.append(time.perf_counter() - started)
            beat = statistics.median(beats)
            label = "disk" if base is None else "/dev/shm (memory emptyDir)"
            print(
                f"| {label} | {count} | {beat * 1e6:.0f} | {statistics.median(writes) * 1e6:.0f} "
                f"| {beat / 5 * 100:.3f} % | {beat / 1 * 100:.3f} % |"
            )


if __name__ == "__main__":
    with recorded("heartbeat", "--record" in sys.argv[1:]):
        main()
