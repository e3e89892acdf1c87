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
import tempfile
import time
from pathlib import Path

from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.samplers import sample_host_memory
from modelkv_testbed.snapshots import (
    make_declaration,
    make_snapshot,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--beats", type=int, default=300)
    args = parser.parse_args()
    print(
        f"{'directory':10} {'declarations':>12} {'beat us (median)':>17} {'plain write us':>15} "
        f"{'core share @5s':>15} {'@1s':>8}"
    )
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
            print(
                f"{where:10} {count:>12} {beat * 1e6:>17.0f} {statistics.median(writes) * 1e6:>15.0f} "
                f"{beat / 5 * 100:>14.4f}% {beat / 1 * 100:>7.3f}%"
            )


if __name__ == "__main__":
    main()
