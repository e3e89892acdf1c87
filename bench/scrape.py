"""Scrape benchmark: /metrics requests per second, p50/p99 latency and RSS, side by side with peers.

Servers run pinned to core 0 and wrk (Debian package) to core 1; every round runs every
server in turn (interleaved), and the table reports the median over rounds. Sizes are counted
in declaration series (5 per declaration: peak, row size, rows, capacity, info), spread over 4
engines. Peers, on the same series:
- ``ceiling``: uvicorn serving the already-rendered body, what any Python server can reach;
- ``node_exporter``: prometheus-node-exporter with only its textfile collector, reading the
  same exposition from a .prom file on every scrape;
- ``client_python``: prometheus_client's own HTTP server on a registry with our collector;
- ``per_scrape``: the sidecar before render-once (FastAPI, render and gzip on every scrape).

Then the cost of a scrape right after the spool changed: one engine's heartbeat (its memory
figures change) and every engine rewritten, against a sequential node_exporter scrape.

    .venv/bin/python -m bench.scrape [--seconds 3] [--rounds 2] [--sizes 100,1000,20000] [--before TREE]

``--before TREE`` adds the sidecar of another checkout (e.g. a ``git worktree`` of an older
commit) as the peer ``before``, run with this environment's packages: a before/after in one run.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from modelkv_exporter.contract.snapshot import MemorySample
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_testbed.bench_tables import RECORD_HELP, recorded
from modelkv_testbed.processes import free_port, stop_process, wait_http
from modelkv_testbed.snapshots import make_declaration, make_snapshot

ROOT = Path(__file__).resolve().parent.parent
ENGINES = 4
SERIES_PER_DECLARATION = 5
PY = sys.executable
EXPORTER = str(Path(PY).parent / "modelkv-exporter")
ROOMY = (
    "--max-snapshot-bytes", "64MiB", "--max-spool-bytes", "256MiB", "--max-declarations", "100000",
    "--max-label-bytes", "256MiB", "--max-series", "1000000", "--max-scrape-label-bytes", "256MiB",
    "--probe-port", "0",
)  # fmt: skip
"""The sizes here pass the default budgets (10 000 series a scrape): every limit raised for this sidecar."""


def fill(spool: Path, series: int) -> list:
    declarations = max(1, series // SERIES_PER_DECLARATION)
    snapshots = []
    for e in range(ENGINES):
        mine = range(e, declarations, ENGINES)
        snapshot = make_snapshot(
            f"engine-{e}",
            declarations=tuple(make_declaration(f"cache_{i}", owner=f"model.layers.{i}") for i in mine),
            measured={"torch_reserved": 1 << 30, "process_gpu": 1 << 31},
            baseline={"torch_reserved": 1 << 30, "process_gpu": 1 << 31},
            heartbeat_at=time.time(),  # a one-shot snapshot: never stale, however long the run
        )
        write_snapshot(spool, snapshot)
        snapshots.append(snapshot)
    return snapshots


def get(port: int, path: str = "/metrics", gzip: bool = False) -> tuple[float, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Accept-Encoding": "gzip"} if gzip else {}
    started = time.perf_counter()
    connection.request("GET", path, headers=headers)
    body = connection.getresponse().read()
    elapsed = time.perf_counter() - started
    connection.close()
    return elapsed, body


def ratio(mine: float, theirs: float) -> str:
    """``mine / theirs`` as a table cell; where the peer answered no request there is no ratio to print."""
    return f"{mine / theirs:.2f}x" if theirs > 0 else "(the peer answered none)"


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(text.split("VmRSS:")[1].split()[0]) / 1024


def wrk(port: int, seconds: float, gzip: bool) -> tuple[float, float, float]:
    command = ["taskset", "-c", "1", "wrk", "-t1", "-c8", f"-d{seconds:.0f}s", "--latency", "--timeout", "30s"]
    if gzip:
        command += ["-H", "Accept-Encoding: gzip"]
    out = subprocess.run([*command, f"http://127.0.0.1:{port}/metrics"], capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]

    def percentile(p: str) -> float:
        value, unit = re.search(rf"\s{p}%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    return rps, percentile("50"), percentile("99")


def start(kind: str, spool: Path, textfiles: Path, body: Path, before: Path | None = None) -> subprocess.Popen[bytes]:
    port = free_port()
    pinned = ["taskset", "-c", "0"]
    env = None
    if kind == "before":
        assert before is not None
        env = {**os.environ, "PYTHONPATH": str(before)}
    commands = {
        "before": [
            PY,
            "-m",
            "modelkv_exporter",
            "serve",
            "--spool-dir",
            str(spool),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        "modelkv": [EXPORTER, "serve", "--spool-dir", str(spool), "--host", "127.0.0.1", "--port", str(port), *ROOMY],
        "per_scrape": [PY, str(ROOT / "bench" / "scrape_servers.py"), "per_scrape", str(port), str(spool)],
        "client_python": [PY, str(ROOT / "bench" / "scrape_servers.py"), "client_python", str(port), str(spool)],
        "ceiling": [PY, str(ROOT / "bench" / "scrape_servers.py"), "ceiling", str(port), str(body)],
        "node_exporter": [
            "prometheus-node-exporter",
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={textfiles}",
            "--web.disable-exporter-metrics",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
    }
    process = subprocess.Popen(
        [*pinned, *commands[kind]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=before or ROOT
    )
    process.port = port  # type: ignore[attr-defined]
    wait_http(f"http://127.0.0.1:{port}/metrics", timeout=60, process=process)  # type: ignore[arg-type]
    for _ in range(3):
        get(port)
    return process


def change_cost(port: int, spool: Path, snapshots: list, everything: bool, repeat: int = 15) -> float:
    """Median seconds of a scrape right after a heartbeat of one engine (or a rewrite of all)."""
    times = []
    for i in range(repeat):
        changed = snapshots if everything else snapshots[:1]
        for snapshot in changed:
            sample = MemorySample(time.time(), {"torch_reserved": (1 << 30) + i + 1, "process_gpu": 1 << 31})
            fresh = replace(snapshot, measured=replace(snapshot.measured, current=sample))
            if everything:
                fresh = replace(
                    fresh, declarations=tuple(reversed(fresh.declarations)) if i % 2 else fresh.declarations
                )
            write_snapshot(spool, fresh)
        times.append(get(port)[0])
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", default="100,1000,20000")
    parser.add_argument("--before", type=Path, help="another checkout whose sidecar runs as the peer 'before'")
    args = parser.parse_args()
    kinds = ["ceiling", "modelkv", *(["before"] if args.before else []), "per_scrape", "client_python", "node_exporter"]
    print(
        "| series | server | body KiB | plain req/s | plain p50 / p99 ms | gzip req/s | gzip p50 / p99 ms | RSS MiB |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for size in map(int, args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="modelkv-bench-") as tmp_name:
            tmp = Path(tmp_name)
            spool, textfiles = tmp / "spool", tmp / "textfiles"
            spool.mkdir()
            textfiles.mkdir()
            snapshots = fill(spool, size)
            probe = start("modelkv", spool, textfiles, tmp / "body")
            body = get(probe.port)[1]  # type: ignore[attr-defined]
            stop_process(probe)
            (tmp / "body").write_bytes(body)
            (textfiles / "modelkv.prom").write_bytes(body)
            servers = {kind: start(kind, spool, textfiles, tmp / "body", args.before) for kind in kinds}
            results: dict[str, list[tuple[float, ...]]] = {kind: [] for kind in kinds}
            try:
                for _ in range(args.rounds):
                    for kind, process in servers.items():
                        plain = wrk(process.port, args.seconds, False)  # type: ignore[attr-defined]
                        zipped = wrk(process.port, args.seconds, True)  # type: ignore[attr-defined]
                        results[kind].append((*plain, *zipped))
                for kind, process in servers.items():
                    m = [statistics.median(column) for column in zip(*results[kind], strict=True)]
                    print(
                        f"| {size} | {kind} | {len(body) / 1024:.0f} | {m[0]:.0f} | {m[1]:.1f} / {m[2]:.1f} "
                        f"| {m[3]:.0f} | {m[4]:.1f} / {m[5]:.1f} | {rss_mib(process.pid):.0f} |",
                        flush=True,
                    )
                ratios = []
                for peer in ("node_exporter", "before"):
                    if peer in results:
                        mine = [statistics.median(c) for c in zip(*results["modelkv"], strict=True)]
                        theirs = [statistics.median(c) for c in zip(*results[peer], strict=True)]
                        ratios.append(
                            f"modelkv / {peer}: {ratio(mine[0], theirs[0])} plain, {ratio(mine[3], theirs[3])} gzip"
                        )
                print(f"|  | {'; '.join(ratios)} |  |  |  |  |  |  |", flush=True)
                node = statistics.median(get(servers["node_exporter"].port)[0] for _ in range(5))  # type: ignore[attr-defined]
                one = change_cost(servers["modelkv"].port, spool, snapshots, everything=False)  # type: ignore[attr-defined]
                every = change_cost(servers["modelkv"].port, spool, snapshots, everything=True)  # type: ignore[attr-defined]
                print(
                    f"|  | after a change: modelkv scrape after one engine's heartbeat {one * 1000:.1f} ms, "
                    f"after every engine rewritten {every * 1000:.1f} ms; one node_exporter scrape {node * 1000:.1f} ms"
                    " |  |  |  |  |  |  |",
                    flush=True,
                )
            finally:
                for process in servers.values():
                    stop_process(process)
    return 0


if __name__ == "__main__":
    if not shutil.which("wrk") or not shutil.which("prometheus-node-exporter"):
        sys.exit("needs the Debian packages wrk and prometheus-node-exporter")
    with recorded("scrape", "--record" in sys.argv[1:]):
        status = main()
    sys.exit(status)
