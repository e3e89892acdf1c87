"""Run the demo: start the engines, wait for their snapshots, serve them, print where to look."""

from __future__ import annotations

import argparse
import multiprocessing.context
import tempfile
import threading
import time
from pathlib import Path

import uvicorn

from modelkv_exporter.app import SidecarConfig, create_app
from modelkv_exporter.demo.engines import DEMO_ENGINES, start_engines
from modelkv_exporter.spool import SpoolReader, snapshot_file_name

STARTUP_TIMEOUT_SECONDS = 180.0


def _wait_for_snapshots(spool_dir: Path, processes: list[multiprocessing.context.SpawnProcess]) -> SpoolReader:
    reader = SpoolReader(spool_dir)
    expected = {snapshot_file_name(engine.engine_id) for engine in DEMO_ENGINES}
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        ready = {
            entry.file_name
            for entry, snapshot in reader.scan().snapshots
            if snapshot.measured.current
            and snapshot.measured.current.sampled_at > snapshot.measured.baseline.sampled_at  # type: ignore[union-attr]
        }
        if expected <= ready:
            return reader
        dead = [p.name for p in processes if not p.is_alive()]
        if dead:
            raise RuntimeError(f"demo engine processes exited before publishing: {', '.join(dead)}")
        time.sleep(0.2)
    raise TimeoutError(f"demo engines did not publish into {spool_dir} within {STARTUP_TIMEOUT_SECONDS:.0f}s")


def _summary(reader: SpoolReader) -> str:
    lines = [f"{'engine':24} {'stage':9} {'owner':24} {'cache':30} {'rows':>4} {'declared peak':>14}"]
    for _, snapshot in reader.scan().snapshots:
        stage = snapshot.engine.stage_label
        if not snapshot.declarations:
            lines.append(f"{snapshot.engine.engine_id:24} {stage:9} {'(no declarations)':24}")
        for d in snapshot.declarations:
            lines.append(
                f"{snapshot.engine.engine_id:24} {stage:9} {d.owner:24} {d.name:30} {d.row_count:>4} {d.peak_bytes / 2**20:>10.1f} MiB"
            )
    return "\n".join(lines)


def run_demo(args: argparse.Namespace) -> int:
    """Start the demo engines and serve their spool until interrupted or ``--duration`` passes."""
    temporary = None if args.spool_dir else tempfile.TemporaryDirectory(prefix="modelkv-demo-")
    spool_dir = Path(args.spool_dir or temporary.name)  # type: ignore[union-attr]
    spool_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"modelkv-exporter demo: starting {len(DEMO_ENGINES)} engine processes publishing into {spool_dir}", flush=True
    )
    processes, stop = start_engines(str(spool_dir), args.heartbeat_interval)
    try:
        reader = _wait_for_snapshots(spool_dir, processes)
        print(_summary(reader), flush=True)
        app = create_app(
            SidecarConfig(spool_dir, stale_after=args.stale_after, max_snapshot_bytes=args.max_snapshot_bytes)
        )
        server = uvicorn.Server(
            uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
        )
        base = f"http://{args.host}:{args.port}"
        print(
            f"\nServing on {base}\n"
            f"  metrics:  {base}/metrics\n"
            f"  engines:  {base}/api/v1/engines\n"
            f"  try:      curl -s {base}/metrics | grep '^modelkv_declared_peak_bytes'\n"
            "Press Ctrl-C to stop.",
            flush=True,
        )
        timer = threading.Timer(args.duration, lambda: setattr(server, "should_exit", True))
        timer.daemon = True
        if args.duration > 0:
            timer.start()
        server.run()
        timer.cancel()
    finally:
        stop.set()
        for process in processes:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
        if temporary is not None:
            temporary.cleanup()
        print("modelkv-exporter demo: engines stopped", flush=True)
    return 0
