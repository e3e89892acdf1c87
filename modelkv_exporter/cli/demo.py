"""The ``demo`` command: start the demo engines, wait for their snapshots, serve them, print where to look.

The caller binds the port before anything slow starts (``cli.ports``), so a taken one fails at once;
the demo engines (``modelkv_exporter.demo``, which need torch and transformers) are imported only
when the demo runs. Once they publish, it prints what they declare, what their caches hold, and
their problems with what to do about each (``presentation.spool_report``'s report, as the page and ``inspect``
show it). The spool is kept when the demo ends, in a directory it prints, so that
``inspect``, ``check`` and ``plan`` can be tried on what it made.
"""

from __future__ import annotations

import argparse
import multiprocessing.context
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from modelkv_exporter.cli.command_line import cli_command
from modelkv_exporter.cli.command_settings import DemoSettings, ServerSettings
from modelkv_exporter.cli.ports import bind_probe_port
from modelkv_exporter.cli.reports import attention_summary, table_lines
from modelkv_exporter.cli.text_layout import MAX_WIDTH
from modelkv_exporter.contract.settings import build
from modelkv_exporter.contract.spool import snapshot_file_name
from modelkv_exporter.sidecar.http.server import build_server
from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig
from modelkv_exporter.sidecar.presentation.spool_report import spool_report
from modelkv_exporter.sidecar.reader.scan import SpoolReader

STARTUP_TIMEOUT_SECONDS = 180.0
QUIET_SECONDS = 10.0
"""The longest the demo stays silent while its engines start."""


def demo_spool_dir(port: int) -> Path:
    """Where the demo publishes unless ``--spool-dir`` says: one directory per port, kept after the demo ends.

    It is made when missing; one that another user owns (the temporary directory is shared) is not
    used, and a new directory beside it is made instead.
    """
    spool_dir = Path(tempfile.gettempdir()) / f"modelkv-demo-{port}"
    spool_dir.mkdir(mode=0o755, exist_ok=True)
    getuid = getattr(os, "getuid", None)
    if getuid is not None and (spool_dir.is_symlink() or spool_dir.stat().st_uid != getuid()):
        return Path(tempfile.mkdtemp(prefix=f"modelkv-demo-{port}-"))
    return spool_dir


def _wait_for_snapshots(
    spool_dir: Path, engine_ids: list[str], processes: list[multiprocessing.context.SpawnProcess]
) -> SpoolReader:
    """Wait until every engine has beaten once after its baseline, printing each engine's two steps as it takes them.

    An engine first publishes its declarations (once its model is built), then its measured memory (after
    its baseline and one heartbeat). While nothing new happens, a line every ``QUIET_SECONDS`` says so.
    """
    reader = SpoolReader(spool_dir)
    expected = {snapshot_file_name(engine_id): engine_id for engine_id in engine_ids}
    order = list(expected)
    started = last_news = time.monotonic()
    steps: dict[str, set[str]] = {"declarations published": set(), "memory measured": set()}
    while time.monotonic() < started + STARTUP_TIMEOUT_SECONDS:
        snapshots = [(entry.file_name, snapshot) for entry, snapshot in reader.scan().snapshots]
        seen = {
            "declarations published": {name for name, _ in snapshots},
            "memory measured": {
                name
                for name, snapshot in snapshots
                if snapshot.measured.current
                and snapshot.measured.current.sampled_at > snapshot.measured.baseline.sampled_at  # type: ignore[union-attr]
            },
        }
        for step, done in steps.items():
            for name in sorted(seen[step] & expected.keys() - done, key=order.index):
                done.add(name)
                last_news = time.monotonic()
                print(f"  {expected[name]}: {step} ({len(done)} of {len(expected)}, {last_news - started:.1f}s)")
        sys.stdout.flush()
        if steps["memory measured"] == expected.keys():
            return reader
        dead = [p.name for p in processes if not p.is_alive()]
        if dead:
            raise RuntimeError(f"demo engine processes exited before publishing: {', '.join(dead)}")
        if time.monotonic() - last_news >= QUIET_SECONDS:
            last_news = time.monotonic()
            counts = ", ".join(f"{len(done)} of {len(expected)} {step}" for step, done in steps.items())
            print(f"  still starting after {last_news - started:.0f}s: {counts}", flush=True)
        time.sleep(0.2)
    raise TimeoutError(f"demo engines did not publish into {spool_dir} within {STARTUP_TIMEOUT_SECONDS:.0f}s")


def _report(reader: SpoolReader, config: SidecarConfig, cli: str) -> str:
    """Per demo engine, what its owners declare beside what their caches held, and the caches it found that nobody
    declares; then the problems and what to do about each: the report ``inspect`` and the page show."""
    view = config.staleness.classify(reader.scan(), time.time())
    report = spool_report(view, ended_too=True)
    lines = []
    for engine in report.engines:
        lines += [f"{engine.engine_id} ({engine.who}):", *table_lines(engine.owners, MAX_WIDTH)]
        lines += [*table_lines(engine.discovered, MAX_WIDTH), ""]
    lines += attention_summary(report, str(config.spool_dir), cli, MAX_WIDTH)
    return "\n".join(lines).rstrip()


def run_demo(args: argparse.Namespace, sock: socket.socket) -> int:
    """Start the demo engines and serve their spool on ``sock`` until interrupted or ``--duration`` passes.

    ``sock`` is bound by the caller before anything slow starts, and the liveness port, when there is one,
    here before torch loads, so a taken port fails at once.
    """
    host, port = sock.getsockname()[:2]
    spool_dir = Path(args.spool_dir) if args.spool_dir else demo_spool_dir(port)
    settings = build(DemoSettings, vars(args))
    cli = cli_command()
    config = build(SidecarConfig, vars(args), spool_dir=spool_dir, cli=cli, cli_spool=str(spool_dir))
    serving = build(ServerSettings, vars(args))
    server = build_server(config, host=serving.host, port=serving.port, log_level=serving.log_level)
    if server.probe is not None and not bind_probe_port("demo", server.probe, port):
        return 2
    try:
        from modelkv_exporter.demo.engines import DEMO_ENGINES, DYING_ENGINE, start_engines
    except ImportError as error:
        print(
            f"modelkv-exporter demo: the demo needs torch and transformers: pip install '.[torch]' in a checkout ({error})",
            file=sys.stderr,
        )
        return 2
    spool_dir.mkdir(parents=True, exist_ok=True)
    engines = (*DEMO_ENGINES, DYING_ENGINE)
    for engine in engines:
        (spool_dir / snapshot_file_name(engine.engine_id)).unlink(missing_ok=True)
    print(
        f"modelkv-exporter demo: starting {len(engines)} engine processes publishing into {spool_dir}\n"
        "  each imports torch and transformers, builds its model, publishes its declarations, allocates its caches\n"
        "  and measures its memory: seconds on a quiet machine, a minute or more on a small busy one",
        flush=True,
    )
    processes, stop = start_engines(str(spool_dir), settings.heartbeat_interval, engines)
    try:
        reader = _wait_for_snapshots(spool_dir, [engine.engine_id for engine in engines], processes)
        print("\n" + _report(reader, config, cli), flush=True)
        base = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        print(
            f"\nServing on {base}\n"
            f"  page:     {base}/   (the problems above first, each with what to do)\n"
            f"  metrics:  {base}/metrics\n"
            f"  engines:  {base}/api/v1/engines\n"
            f"  try:      curl -s {base}/metrics | grep -E '^modelkv_(declared|observed)_peak_bytes'\n"
            f"  and, in another terminal, the spool itself:\n"
            f"            {cli} inspect {spool_dir}\n"
            f"            {cli} check {spool_dir}\n"
            f"            {cli} plan {spool_dir} --max-num-seqs 64 --cache-memory 2GiB\n"
            "Press Ctrl-C to stop; the engines' ended snapshots stay in the spool.",
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
        print(
            f"modelkv-exporter demo: engines stopped; their ended snapshots stay in {spool_dir}:\n"
            f"  {cli} inspect {spool_dir}\n"
            f"  {cli} check {spool_dir}\n"
            f"  {cli} plan {spool_dir} --max-num-seqs 64 --cache-memory 2GiB",
            flush=True,
        )
    return 0
