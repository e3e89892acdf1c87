"""Instructions a scrape of an unchanged spool costs in the sidecar's ASGI app, counted by callgrind.

Wall-clock figures on a shared 2-core machine move by a factor of three between runs;
instruction counts do not. For each size, the app is called in-process (no socket, no
uvicorn) with a Prometheus-like request, and the count of ``--requests`` scrapes minus the
count of none gives the instructions of one scrape: the whole app (router, negotiation,
render) and the render alone. ``--before TREE`` counts another checkout the same way
(a ``git worktree`` of an older commit), so a before/after is one run: each tree is counted in a
process of its own whose ``PYTHONPATH`` is that tree, so its ``modelkv_exporter`` is found before
the installed one (two versions of one package cannot share a process); the snapshots are built
by the installed ``modelkv_testbed``. The spool's periodic
full scan (once a second of wall time) is left out: valgrind slows the clock-driven part.

    .venv/bin/python -m bench.scrape_instructions [--sizes 100,1000] [--requests 500] [--before TREE]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from modelkv_testbed.bench_tables import RECORD_HELP, recorded

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import asyncio, sys, tempfile, time
from pathlib import Path
tree, what, series, requests = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
from modelkv_testbed.snapshots import make_declaration, make_snapshot
try:
    from modelkv_exporter.contract.spool import write_snapshot
    from modelkv_exporter.sidecar.http.app import SidecarConfig, make_app as build
except ImportError:  # the flat package of before the layout change
    from modelkv_exporter.spool import write_snapshot
    from modelkv_exporter.app import SidecarConfig, create_app as build
spool = Path(tempfile.mkdtemp())
declarations = max(1, series // 5)
for e in range(4):
    mine = tuple(make_declaration(f"c{i}", owner=f"m.l{i}") for i in range(e, declarations, 4))
    write_snapshot(spool, make_snapshot(f"engine-{e}", declarations=mine, heartbeat_at=time.time() + 3600))
app = build(SidecarConfig(spool))
cache = getattr(app, "exposition", None) or app.state.exposition
reader = cache.source.reader if hasattr(cache, "source") else cache.collector.reader
reader.full_scan_every = 1e9  # the periodic full scan follows wall time, which valgrind stretches: counted apart
headers = [(b"host", b"x"), (b"user-agent", b"Prometheus/2.42.0"), (b"accept-encoding", b"gzip"),
           (b"accept", b"application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")]
scope = {"type": "http", "method": "GET", "path": "/metrics", "raw_path": b"/metrics", "root_path": "",
         "query_string": b"", "headers": headers, "scheme": "http", "server": ("127.0.0.1", 9400),
         "client": ("127.0.0.1", 1), "http_version": "1.1", "asgi": {"version": "3.0"}}

async def receive():
    return {"type": "http.request", "body": b"", "more_body": False}

async def send(message):
    pass

async def scrapes(n):
    for _ in range(n):
        if what == "app":
            await app(dict(scope), receive, send)
        else:
            cache.render(openmetrics=True, compress=True)

asyncio.run(scrapes(50))
asyncio.run(scrapes(requests))
"""


def instructions(tree: Path, what: str, series: int, requests: int) -> int:
    result = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", PROBE]
        + [str(tree), what, str(series), str(requests)],
        capture_output=True,
        text=True,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])},
    )
    found = re.search(r"Collected : (\d+)", result.stderr)
    if result.returncode != 0 or found is None:
        raise RuntimeError(result.stderr[-2000:])
    return int(found.group(1))


def per_scrape(tree: Path, what: str, series: int, requests: int) -> int:
    return (instructions(tree, what, series, requests) - instructions(tree, what, series, 0)) // requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--before", type=Path)
    args = parser.parse_args()
    trees = {"this tree": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    print("| series | tree | instructions per scrape (whole app) | of which render |")
    print("|---:|---|---:|---:|")
    for series in map(int, args.sizes.split(",")):
        for name, tree in trees.items():
            app = per_scrape(tree, "app", series, args.requests)
            render = per_scrape(tree, "render", series, args.requests)
            print(f"| {series} | {name} | {app:,} | {render:,} |", flush=True)
    return 0


if __name__ == "__main__":
    if not shutil.which("valgrind"):
        sys.exit("needs valgrind")
    with recorded("scrape_instructions", "--record" in sys.argv[1:]):
        status = main()
    sys.exit(status)
