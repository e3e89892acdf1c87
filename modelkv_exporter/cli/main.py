"""The ``modelkv-exporter`` command: ``serve`` the sidecar, run the ``demo``, ``inspect``, ``plan`` or ``check`` a
spool."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from modelkv_exporter.cli.arguments import add_settings, apply_environment, attach_dashed_values
from modelkv_exporter.cli.command_settings import TABLES, ServerSettings
from modelkv_exporter.cli.extras import SIDECAR, missing_extra
from modelkv_exporter.contract.settings import build
from modelkv_exporter.contract.version import VERSION

if TYPE_CHECKING:
    from modelkv_exporter.sidecar.reader.scan import SpoolScan

PLAN_HELP = (
    "each engine's peak at another max_num_seqs (--max-num-seqs), the largest max_num_seqs whose peak fits in "
    "--cache-memory, or both; from the declarations, scaled up where an owner was observed holding more"
)
DESCRIPTION = "Serve, inspect and plan the model-local KV declarations engines publish into a spool directory."


def serve(args: argparse.Namespace) -> int:
    """Run the sidecar HTTP server over ``--spool-dir``; a taken port, HTTP or liveness, ends it with one line.

    Without the ``sidecar`` extra's libraries it says so in one line.
    """
    try:
        from modelkv_exporter.cli.ports import bind_http_port, bind_probe_port
        from modelkv_exporter.sidecar.http.server import build_server
        from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig
    except ModuleNotFoundError as error:
        return missing_extra("serve", error, (SIDECAR,))

    settings = build(ServerSettings, vars(args))
    config = build(SidecarConfig, vars(args), spool_dir=Path(args.spool_dir))
    sock = bind_http_port("serve", settings.host, settings.port, config.probe_port, "--port {port}")
    if sock is None:
        return 2
    with sock:
        port = sock.getsockname()[1]
        server = build_server(config, host=settings.host, port=settings.port, log_level=settings.log_level)
        if server.probe is not None and not bind_probe_port("serve", server.probe, port):
            return 2
        logging.getLogger("modelkv_exporter").info("serving %s on http://%s:%s", config.spool_dir, settings.host, port)
        server.run(sockets=[sock])
    return 0


def demo(args: argparse.Namespace) -> int:
    """Run the demo (needs the ``sidecar`` and ``torch`` extras); a taken port fails before any engine starts."""
    try:
        from modelkv_exporter.cli.demo import run_demo
        from modelkv_exporter.cli.ports import bind_http_port
    except ModuleNotFoundError as error:
        return missing_extra("demo", error, (SIDECAR, "torch"))

    sock = bind_http_port("demo", args.host, args.port, args.probe_port, "MODELKV_PORT={port} make demo")
    if sock is None:
        return 2
    with sock:
        return run_demo(args, sock)


def _spool_of(args: argparse.Namespace) -> Path:
    """DIR, else --spool-dir or MODELKV_SPOOL_DIR; a DIR that differs from MODELKV_SPOOL_DIR is named in a note.

    DIR and a different --spool-dir never get here: ``parse_arguments`` refuses them.
    """
    if args.directory and args.spool_dir and not _same_directory(args.directory, args.spool_dir):
        print(
            f"modelkv-exporter {args.command}: reading DIR {args.directory}, not MODELKV_SPOOL_DIR {args.spool_dir}",
            file=sys.stderr,
        )
    directory = args.directory or args.spool_dir
    if not directory:
        raise SystemExit(f"modelkv-exporter {args.command}: give DIR, --spool-dir or MODELKV_SPOOL_DIR")
    return Path(directory)


def _same_directory(one: str, other: str) -> bool:
    return Path(one).resolve() == Path(other).resolve()


def _unreadable(args: argparse.Namespace, error: str | None) -> int:
    print(f"modelkv-exporter {args.command}: cannot read the spool: {error}", file=sys.stderr)
    return 1


def _spool_scan(args: argparse.Namespace, directory: Path | None = None) -> SpoolScan:
    """One scan of the command's spool directory (``directory``, else the one the arguments give) within its size
    and file budgets."""
    from modelkv_exporter.sidecar.reader.scan import SpoolLimits

    return build(SpoolLimits, vars(args)).reader(directory or _spool_of(args)).scan()


def inspect(args: argparse.Namespace) -> int:
    """Print a summary of the problems and what to do, every engine's declarations in full, and every rejected
    file."""
    import time

    from modelkv_exporter.cli.command_line import cli_command
    from modelkv_exporter.cli.reports import inspect_report
    from modelkv_exporter.cli.text_layout import report_width
    from modelkv_exporter.sidecar.reader.state import Staleness, spool_liveness

    directory = _spool_of(args)
    scan = _spool_scan(args, directory)
    if not scan.ok:
        return _unreadable(args, scan.error)
    view = build(Staleness, vars(args)).classify(scan, time.time(), spool_liveness(Path(directory)))
    sys.stdout.write(inspect_report(view, report_width(), str(directory), cli_command()))
    return 0


def plan(args: argparse.Namespace) -> int:
    """Print each engine's peak now, at --max-num-seqs, and the largest max_num_seqs whose peak fits --cache-memory."""
    import time

    from modelkv_exporter.cli.command_line import cli_command
    from modelkv_exporter.cli.command_settings import PlanSettings
    from modelkv_exporter.cli.reports import plan_report
    from modelkv_exporter.cli.text_layout import report_width
    from modelkv_exporter.sidecar.reader.state import Staleness, spool_liveness

    wanted = build(PlanSettings, vars(args))
    if wanted.max_num_seqs is None and wanted.cache_memory is None:
        args.subparser.error(
            "--max-num-seqs, --cache-memory or both are needed (or MODELKV_MAX_NUM_SEQS, MODELKV_CACHE_MEMORY): "
            "the peak at a max_num_seqs, the largest max_num_seqs whose peak fits in a cache memory"
        )
    directory = _spool_of(args)
    scan = _spool_scan(args, directory)
    if not scan.ok:
        return _unreadable(args, scan.error)
    view = build(Staleness, vars(args)).classify(scan, time.time(), spool_liveness(Path(directory)))
    report = plan_report(view, wanted.max_num_seqs, wanted.cache_memory, report_width(), str(directory), cli_command())
    sys.stdout.write(report)
    return 0


def check(args: argparse.Namespace) -> int:
    """Print every owner's verdict and a suggested declaration; exit 1 when one fails (or the spool is unreadable)."""
    from modelkv_exporter.cli.check_report import check_report

    scan = _spool_scan(args)
    if not scan.ok:
        return _unreadable(args, scan.error)
    text, passing = check_report(scan)
    sys.stdout.write(text)
    return 0 if passing else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, built from the commands' settings tables."""
    parser = argparse.ArgumentParser(prog="modelkv-exporter", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, handler, help_text in (
        ("serve", serve, "serve /metrics for a spool directory (the sidecar)"),
        ("demo", demo, "run demo engines with real transformers caches and serve them"),
        ("inspect", inspect, "print every engine's declarations in a spool directory"),
        ("plan", plan, PLAN_HELP),
        ("check", check, "whether each owner's caches hold what it declares, and what it should declare"),
    ):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name in ("inspect", "plan", "check"):
            sub.add_argument("directory", nargs="?", metavar="DIR", help="the spool directory")
        add_settings(sub, TABLES[name])
        sub.set_defaults(handler=handler, subparser=sub)
    return parser


def parse_arguments(argv: Sequence[str] | None, environ: Mapping[str, str]) -> argparse.Namespace:
    """The command and its settings from ``argv``, then ``environ`` for every setting not given as a flag."""
    argv = attach_dashed_values(list(sys.argv[1:] if argv is None else argv), TABLES)
    args = build_parser().parse_args(argv)
    directory, flag = getattr(args, "directory", None), args.spool_dir
    if directory and flag and not _same_directory(directory, flag):
        args.subparser.error(f"DIR {directory} and --spool-dir {flag} name different directories: give one")
    apply_environment(args.subparser, args, TABLES[args.command], environ)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and of ``python -m modelkv_exporter``; no arguments print the help."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        build_parser().print_help()
        return 0
    args = parse_arguments(argv, os.environ)
    logging.basicConfig(
        level=getattr(args, "log_level", "warning").upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 0
