"""The ``demo`` command: bind the port, start the demo engines, wait for their snapshots, serve them, print where to look.

The port is bound before anything slow starts, so a taken one fails at once; the demo engines
(``modelkv_exporter.demo``, which need torch and transformers) are imported only when the demo runs.
"""

from __future__ import annotations

import argparse
import multiprocessing.context
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from modelkv_exporter.cli.reports import table
from modelkv_exporter.cli.settings import DemoSettings, ServerSettings
from modelkv_exporter.contract.settings import build
from modelkv_exporter.contract.spool import snapshot_file_name
from modelkv_exporter.sidecar.http.config import SidecarConfig
from modelkv_exporter.sidecar.http.server import build_server
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.sizes import human_bytes
from modelkv_exporter.sidecar.vocabulary import ROOT_OWNER

STARTUP_TIMEOUT_SECONDS = 180.0


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` as uvicorn binds one; ``OSError`` when the address is taken or wrong."""
    family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, protocol)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def taken_port_message(host: str, port: int, error: OSError) -> str:
    """What to tell a user whose demo port cannot be bound: the flag and the variable that change it."""
    return (
        f"modelkv-exporter demo: cannot listen on {host}:{port} ({error.strerror or error}); "
        "choose another port with --port or MODELKV_PORT (for example: MODELKV_PORT=9401 make demo)"
    )


def _wait_for_snapshots(
    spool_dir: Path, engine_ids: list[str], processes: list[multiprocessing.context.SpawnProcess]
) -> SpoolReader:
    reader = SpoolReader(spool_dir)
    expected = {snapshot_file_name(engine_id) for engine_id in engine_ids}
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
    rows = []
    for _, snapshot in reader.scan().snapshots:
        who = [snapshot.engine.engine_id, snapshot.engine.stage_label]
        if not snapshot.declarations:
            rows.append([*who, "(no declarations)", "", "", ""])
        rows += [
            [*who, d.owner or ROOT_OWNER, d.name, str(d.row_count), human_bytes(d.peak_bytes)]
            for d in snapshot.declarations
        ]
    return table(["engine", "stage", "owner", "cache", "rows", "declared peak"], rows)


def _observed_summary(reader: SpoolReader) -> str:
    """Per owner: what it declares beside what its caches were observed to hold."""
    rows = []
    for _, snapshot in reader.scan().snapshots:
        for observation in snapshot.observations:
            declared = snapshot.declared_peak_of(observation.owner)
            peak = observation.peak_bytes
            if not observation.available or peak is None:
                verdict, observed = f"not observed: {observation.reason}", "—"
            elif peak > declared:
                verdict, observed = f"holds {peak / max(declared, 1):.2f}x its declaration", human_bytes(peak)
            else:
                verdict, observed = "within its declaration", human_bytes(peak)
            owner = observation.owner or ROOT_OWNER
            rows.append([snapshot.engine.engine_id, owner, human_bytes(declared), observed, verdict])
    return table(["engine", "owner", "declared peak", "observed peak", ""], rows)


def run_demo(args: argparse.Namespace, sock: socket.socket) -> int:
    """Start the demo engines and serve their spool on ``sock`` until interrupted or ``--duration`` passes.

    ``sock`` is bound by the caller before anything slow starts, so a taken port fails at once.
    """
    try:
        from modelkv_exporter.demo.engines import DEMO_ENGINES, start_engines
    except ImportError as error:
        print(
            f"modelkv-exporter demo: the demo needs torch and transformers: pip install '.[torch]' in a checkout ({error})",
            file=sys.stderr,
        )
        return 2
    temporary = None if args.spool_dir else tempfile.TemporaryDirectory(prefix="modelkv-demo-")
    spool_dir = Path(args.spool_dir or temporary.name)  # type: ignore[union-attr]
    spool_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"modelkv-exporter demo: starting {len(DEMO_ENGINES)} engine processes publishing into {spool_dir}", flush=True
    )
    settings = build(DemoSettings, vars(args))
    processes, stop = start_engines(str(spool_dir), settings.heartbeat_interval)
    try:
        reader = _wait_for_snapshots(spool_dir, [engine.engine_id for engine in DEMO_ENGINES], processes)
        print(_summary(reader), flush=True)
        print("\n" + _observed_summary(reader), flush=True)
        config = build(SidecarConfig, vars(args), spool_dir=spool_dir)
        serving = build(ServerSettings, vars(args))
        server = build_server(config, host=serving.host, port=serving.port, log_level=serving.log_level)
        host, port = sock.getsockname()[:2]
        base = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        print(
            f"\nServing on {base}\n"
            f"  page:     {base}/\n"
            f"  metrics:  {base}/metrics\n"
            f"  engines:  {base}/api/v1/engines\n"
            f"  try:      curl -s {base}/metrics | grep -E '^modelkv_(declared|observed)_peak_bytes'\n"
            "Press Ctrl-C to stop.",
            flush=True,
        )
        timer = threading.Timer(settings.duration, lambda: setattr(server, "should_exit", True))
        timer.daemon = True
        if settings.duration > 0:
            timer.start()
        server.run(sockets=[sock])
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
