"""The hardening issue's attacks at full size against the real sidecar, with what happens now (docs/reliability.md).

    .venv/bin/python -m bench.attack                      # every scenario, about 6 minutes
    .venv/bin/python -m bench.attack --only worst_load    # one (see --list)
    .venv/bin/python -m bench.attack --json out.json      # the figures as JSON too

The sidecar runs with its default limits, pinned to core 0 (``taskset -c 0``); this harness, its
probers and ``wrk`` (Debian's) run on core 1. Everything goes to 127.0.0.1 and every loop is
bounded in bytes, connections and time. A prober is a separate process that opens a new
connection for each ``GET /healthz`` and waits 5 s at most, as the kubelet does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.processes import free_port
from modelkv_testbed.snapshots import make_declaration, make_snapshot
from modelkv_testbed.worst_spool import describe, write_worst_spool

ROOT = Path(__file__).resolve().parents[1]
EXE = Path(os.environ.get("MODELKV_BENCH_EXE", Path(sys.executable).parent / "modelkv-exporter"))
MiB = 1 << 20
PROBE_INTERVAL = 0.1


class Sidecar:
    """``modelkv-exporter serve`` on core 0, its output in a file, its memory and descriptors from /proc."""

    def __init__(self, spool: Path, *flags: str) -> None:
        self.port, self.probe_port = free_port(), free_port()
        self.log = spool.parent / f"sidecar-{self.port}.log"
        command = ["taskset", "-c", "0", str(EXE), "serve", "--spool-dir", str(spool), "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--probe-port", str(self.probe_port), "--log-level", "info", *flags]
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if request(self.probe_port, "/healthz", timeout=1)[0] == 200:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"the sidecar did not start: {self.log.read_text()[-2000:]}")
        self.start = self.stats()

    def stats(self) -> dict[str, float]:
        """RSS now and at its peak (MiB), open descriptors, CPU seconds."""
        status = dict(line.split(":", 1) for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines())
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return {
            "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
            "peak_rss_mib": int(status["VmHWM"].split()[0]) / 1024,
            "fds": len(os.listdir(f"/proc/{self.process.pid}/fd")),
            "cpu_s": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
        }

    def metrics(self) -> Exposition:
        status, _, body = request(self.port, "/metrics", timeout=30)
        assert status == 200, status
        return Exposition(body.decode())

    def refusals(self) -> dict[str, float]:
        return {k: v for k, v in self.metrics().by("modelkv_exporter_http_refusals_total", "reason").items() if v}

    def log_lines(self, text: str = "") -> int:
        return sum(1 for line in self.log.read_text(errors="replace").splitlines() if text in line)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def request(port: int, path: str, *, timeout: float = 5.0, head: bytes = b"", method: str = "GET") -> tuple:
    """``(status, seconds, body)`` of one request on a new connection; status 0 when it failed."""
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode() + head + b"\r\n")
            data = b""
            while chunk := sock.recv(1 << 20):
                data += chunk
    except OSError:
        return 0, time.perf_counter() - started, b""
    status = int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, time.perf_counter() - started, data.partition(b"\r\n\r\n")[2]


class Prober:
    """A kubelet-like prober in its own process on core 1: ``GET /healthz`` every 0.1 s, 5 s timeout."""

    CODE = """
import json, socket, sys, time
port, seconds, interval = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
out, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    t = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\\r\\nHost: x\\r\\nUser-Agent: kube-probe/1.31\\r\\nConnection: close\\r\\n\\r\\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        out.append([int(data[9:12]) if data[:5] == b"HTTP/" else 0, time.perf_counter() - t])
    except OSError:
        out.append([0, time.perf_counter() - t])
    time.sleep(max(0.0, interval - (time.perf_counter() - t)))
print(json.dumps(out))
"""

    def __init__(self, port: int, seconds: float) -> None:
        command = ["taskset", "-c", "1", sys.executable, "-c", self.CODE, str(port), str(seconds), str(PROBE_INTERVAL)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

    def result(self) -> dict[str, Any]:
        out, _ = self.process.communicate(timeout=600)
        probes = json.loads(out)
        times = sorted(t * 1000 for _, t in probes)
        failed = sum(1 for status, _ in probes if status != 200)
        return {
            "probes": len(probes),
            "failed": failed,
            "p50_ms": round(statistics.median(times), 1),
            "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 1),
            "max_ms": round(times[-1], 1),
        }


def wrk(url: str, connections: int, seconds: int, *headers: str) -> dict[str, Any]:
    """``wrk`` on core 1: requests per second, non-2xx answers and socket errors."""
    command = ["taskset", "-c", "1", "wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s"]
    for header in headers:
        command += ["-H", header]
    out = subprocess.run([*command, url], capture_output=True, text=True, timeout=seconds + 120).stdout
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    return {
        "requests_per_s": float(rate.group(1)) if rate else 0.0,
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": dict(zip(("connect", "read", "write", "timeout"), map(int, errors.groups()), strict=True))
        if errors
        else {},
    }


def stream(port: int, head: bytes, piece: bytes, limit: int, seconds: float, rate: float = 0.0) -> dict[str, Any]:
    """Send ``head``, then ``piece`` again and again until the server answers or closes, ``limit`` bytes or
    ``seconds`` pass (at ``rate`` bytes/s when given). What the server answered and how much it took."""
    sent, started, answer = 0, time.monotonic(), b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        while sent < limit and time.monotonic() - started < seconds and not answer:
            try:
                answer = sock.recv(4096)
                if not answer:
                    answer = b"(closed)"
                break
            except BlockingIOError:
                pass
            try:
                sent += sock.send(piece)
            except BlockingIOError:
                time.sleep(0.001)
            except OSError:
                break
            if rate:
                time.sleep(max(0.0, sent / rate - (time.monotonic() - started)))
    status = int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else answer.decode(errors="replace")[:20]
    return {"answer": status, "sent_mib": round(sent / MiB, 2), "seconds": round(time.monotonic() - started, 2)}


def spool_dir(base: Path, name: str) -> Path:
    path = base / name / "spool"
    path.mkdir(parents=True)
    return path


# --- the findings --------------------------------------------------------------------------------


def finding_1_one_file(base: Path) -> dict[str, Any]:
    """A 7.8 MiB snapshot of many small declarations with 250-character non-ASCII names, beside a normal engine;
    read with the default 256 KiB file limit, and with --max-snapshot-bytes 8MiB (the declaration budget then)."""
    spool = spool_dir(base, "one-file")
    write_snapshot(spool, make_snapshot("normal"))
    name = "名" * 250
    declaration = make_declaration("c", owner="o", capacity_source="s")
    one = len(json.dumps(vars(declaration), separators=(",", ":")))
    count = int(7.8 * MiB - 2000) // (one + 6)
    decls = tuple(replace(declaration, name=f"c{i}") for i in range(count))
    data = make_snapshot(name, declarations=decls, served_model_name=name).to_json()
    (spool / "huge.json").write_bytes(data)
    out: dict[str, Any] = {"file_mib": round(len(data) / MiB, 2), "declarations": count}
    for label, flags in (
        ("default limits", ()),
        (
            "--max-snapshot-bytes 8MiB --max-spool-bytes 16MiB",
            ("--max-snapshot-bytes", "8MiB", "--max-spool-bytes", "16MiB"),
        ),
    ):
        sidecar = Sidecar(spool, *flags)
        try:
            prober = Prober(sidecar.probe_port, 10)
            started = time.monotonic()
            first = sidecar.metrics()
            first_s = time.monotonic() - started
            for _ in range(20):
                request(sidecar.port, "/metrics", timeout=30)
            out[label] = {
                "first_scrape_s": round(first_s, 2),
                "engines_exported": sorted(s.labels["engine"] for s in first.all("modelkv_engine_up")),
                "rejections": {
                    k: v for k, v in first.by("modelkv_exporter_snapshot_rejections_total", "reason").items() if v
                },
                "rss": f"{sidecar.start['rss_mib']:.0f} -> peak {sidecar.stats()['peak_rss_mib']:.0f} MiB",
                "probe": prober.result(),
            }
        finally:
            sidecar.stop()
    return out


def finding_2_3_heads(base: Path) -> dict[str, Any]:
    """200 MiB of headers, a 64 MiB header, a 100 MiB URL sent slowly, 2 MiB and 8 MiB Accept headers of commas."""
    sidecar = Sidecar(spool_dir(base, "heads"))
    try:
        prober = Prober(sidecar.probe_port, 25)
        get = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
        out = {
            "200 MiB of headers": stream(sidecar.port, get, b"X-a: b\r\n" * 8192, 200 * MiB, 60),
            "one 64 MiB header": stream(sidecar.port, get + b"X-big: ", b"a" * 65536, 64 * MiB, 60),
            "100 MiB URL at 4 MiB/s": stream(sidecar.port, b"GET /", b"a" * 65536, 100 * MiB, 30, rate=4 * MiB),
            "Accept-Encoding of 2 MiB commas": stream(
                sidecar.port, get + b"Accept-Encoding: ", b"," * 65536, 2 * MiB, 30
            ),
            "Accept of 8 MiB commas": stream(sidecar.port, get + b"Accept: ", b"," * 65536, 8 * MiB, 30),
        }
        out["rss"] = f"{sidecar.start['rss_mib']:.0f} -> peak {sidecar.stats()['peak_rss_mib']:.0f} MiB"
        out["cpu_s"] = round(sidecar.stats()["cpu_s"] - sidecar.start["cpu_s"], 2)
        out["refusals"] = sidecar.refusals()
        out["probe"] = prober.result()
        return out
    finally:
        sidecar.stop()


def finding_4_connections(base: Path) -> dict[str, Any]:
    """500 slowloris connections for 30 s; 6 000 silent connections; fresh clients meanwhile."""
    sidecar = Sidecar(spool_dir(base, "connections"))
    try:
        prober = Prober(sidecar.probe_port, 45)
        slow = []
        for _ in range(500):
            sock = socket.create_connection(("127.0.0.1", sidecar.port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            sock.setblocking(False)
            slow.append(sock)
        started = time.monotonic()
        answers: dict[str, int] = {}
        while time.monotonic() - started < 30 and slow:
            still = []
            for sock in slow:
                try:
                    data = sock.recv(4096)
                    key = data[9:12].decode() if data.startswith(b"HTTP/") else "closed"
                    answers[key] = answers.get(key, 0) + 1
                    sock.close()
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    answers["reset"] = answers.get("reset", 0) + 1
                    sock.close()
                    continue
                try:
                    sock.send(b"X-a: b\r\n")
                except OSError:
                    pass
                still.append(sock)
            slow = still
            time.sleep(2)
        open_after = time.monotonic() - started
        for sock in slow:
            sock.close()
        slowloris = {"answers": answers, "still_open": len(slow), "all_closed_after_s": round(open_after, 1)}

        silent, peak_fds = [], 0
        for _ in range(6000):
            try:
                silent.append(socket.create_connection(("127.0.0.1", sidecar.port), timeout=5))
            except OSError:
                break
            if len(silent) % 500 == 0:
                peak_fds = max(peak_fds, int(sidecar.stats()["fds"]))
        fresh = [request(sidecar.port, "/healthz")[0] for _ in range(20)]
        time.sleep(6)
        closed = 0
        for sock in silent:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
            sock.close()
        return {
            "slowloris_500": slowloris,
            "silent_6000": {
                "opened": len(silent),
                "server_fds_peak": peak_fds,
                "closed_by_server_within_6s": closed,
                "fresh_clients_200": fresh.count(200),
            },
            "rss": f"{sidecar.start['rss_mib']:.0f} -> peak {sidecar.stats()['peak_rss_mib']:.0f} MiB",
            "refusals": sidecar.refusals(),
            "probe": prober.result(),
        }
    finally:
        sidecar.stop()


def finding_5_9_text(base: Path) -> dict[str, Any]:
    """A file name that is not UTF-8; bidi, NUL and ESC in every text field."""
    spool = spool_dir(base, "text")
    spoof = "ad\u202emin\u2066x\u0000y\u001b[31m"
    write_snapshot(spool, make_snapshot(spoof, declarations=(make_declaration(spoof, owner=spoof),), stage_name=spoof))
    with open(os.fsencode(spool) + b"/rej\xff.json", "wb") as handle:
        handle.write(b"{")
    sidecar = Sidecar(spool)
    try:
        out: dict[str, Any] = {}
        for path in ("/", "/api/v1/engines", "/metrics"):
            status, _, body = request(sidecar.port, path)
            raw = [hex(ord(c)) for c in "\u202e\u2066\u0000\u001b" if c.encode() in body]
            out[path] = {"status": status, "raw_invisible_characters": raw}
        return out
    finally:
        sidecar.stop()


def finding_6_probes(base: Path) -> dict[str, Any]:
    """50 000 small files; three clients hammering /; wrk -c4000 on /metrics. Probes meanwhile."""
    spool = spool_dir(base, "many-files")
    data = make_snapshot("x", declarations=()).to_json()
    for i in range(50_000):
        (spool / f"f{i:05}.json").write_bytes(data.replace(b'"x"', b'"e%05d"' % i))
    sidecar = Sidecar(spool)
    try:
        out: dict[str, Any] = {}
        prober = Prober(sidecar.probe_port, 15)
        started = time.monotonic()
        first = sidecar.metrics()
        out["50000_files"] = {
            "first_scrape_s": round(time.monotonic() - started, 2),
            "later_scrape_s": round(min(request(sidecar.port, "/metrics")[1] for _ in range(5)), 3),
            "engines_exported": len(first.all("modelkv_engine_up")),
            "files_rejected_unread": first.value("modelkv_exporter_spool_files", state="rejected"),
            "rss": f"{sidecar.start['rss_mib']:.0f} -> peak {sidecar.stats()['peak_rss_mib']:.0f} MiB",
        }
        out["50000_files"]["probe"] = prober.result()

        main_port = Prober(sidecar.port, 15)
        prober = Prober(sidecar.probe_port, 15)
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                request(sidecar.port, "/")

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for thread in threads:
            thread.start()
        time.sleep(15)
        stop.set()
        for thread in threads:
            thread.join()
        out["3_clients_on_landing_page"] = {"probe_port": prober.result(), "main_port_healthz": main_port.result()}

        prober = Prober(sidecar.probe_port, 20)
        main_port = Prober(sidecar.port, 20)
        load = wrk(f"http://127.0.0.1:{sidecar.port}/metrics", 4000, 20)
        out["wrk_c4000_metrics"] = {"wrk": load, "probe_port": prober.result(), "main_port_healthz": main_port.result()}
        out["refusals"] = sidecar.refusals()
        return out
    finally:
        sidecar.stop()


def finding_7_8_data(base: Path) -> dict[str, Any]:
    """Labels that meet once cut or sanitised; heartbeats ten years ahead; started after its heartbeat."""
    spool = spool_dir(base, "data")
    write_snapshot(
        spool,
        make_snapshot("long", declarations=(make_declaration("x" * 128 + "A"), make_declaration("x" * 128 + "B"))),
    )
    write_snapshot(spool, make_snapshot("vic\ttim"))
    write_snapshot(spool, make_snapshot("vic\ntim"))
    future = make_snapshot("immortal", heartbeat_at=time.time() + 10 * 365 * 86400, interval=5.0)
    write_snapshot(spool, future)
    backwards = make_snapshot("backwards")
    write_snapshot(spool, replace(backwards, started_at=backwards.heartbeat_at + 60))
    sidecar = Sidecar(spool)
    try:
        _, _, body = request(sidecar.port, "/metrics", head=b"Accept: application/openmetrics-text\r\n")
        exposition = Exposition(body.decode(), openmetrics=True)  # refuses a body with duplicate series
        return {
            "long_caches_exported": len(exposition.all("modelkv_declared_peak_bytes", engine="long")),
            "vic_tim_engines_exported": len(exposition.all("modelkv_engine_up", engine="vic tim")),
            "immortal_up": exposition.value("modelkv_engine_up", engine="immortal"),
            "rejections": {
                k: v for k, v in exposition.by("modelkv_exporter_snapshot_rejections_total", "reason").items() if v
            },
        }
    finally:
        sidecar.stop()


def finding_10_negotiation(base: Path) -> dict[str, Any]:
    """The refusals the issue lists, as the sidecar answers them."""
    spool = spool_dir(base, "negotiation")
    write_snapshot(spool, make_snapshot("e"))
    sidecar = Sidecar(spool)
    out = {}
    try:
        for name, value in (
            ("Accept-Encoding", "identity;q=0"),
            ("Accept-Encoding", "*;q=0"),
            ("Accept-Encoding", "gzip;level=1;q=0"),
            ("Accept-Encoding", "gzip;q=0,gzip;q=1"),
            ("Accept", "application/openmetrics-text;q=0"),
        ):
            with socket.create_connection(("127.0.0.1", sidecar.port), timeout=5) as sock:
                sock.sendall(
                    f"GET /metrics HTTP/1.1\r\nHost: x\r\n{name}: {value}\r\nConnection: close\r\n\r\n".encode()
                )
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
            head = data.partition(b"\r\n\r\n")[0].decode().lower()
            encoding = re.search(r"content-encoding: (\S+)", head)
            kind = re.search(r"content-type: ([^;\r]+)", head)
            out[f"{name}: {value}"] = (
                f"{head[9:12]} {kind.group(1) if kind else ''} {encoding.group(1) if encoding else 'identity'}"
            )
        return out
    finally:
        sidecar.stop()


def finding_11_rough_edges(base: Path) -> dict[str, Any]:
    """HEAD, a 1e9-byte POST, 5 000 invalid requests, /openapi.json, paths and OS errors, special files."""
    spool = spool_dir(base, "rough")
    write_snapshot(spool, make_snapshot("e"))
    os.mkfifo(spool / "fifo.json")
    sidecar = Sidecar(spool)
    try:
        out: dict[str, Any] = {
            "HEAD": {
                path: request(sidecar.port, path, method="HEAD")[0] for path in ("/", "/metrics", "/api/v1/engines")
            },
            "/openapi.json": request(sidecar.port, "/openapi.json")[0],
            "POST 1e9 bytes": stream(
                sidecar.port,
                b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n",
                b"x" * 65536,
                1000 * MiB,
                20,
            ),
        }
        before = sidecar.log_lines()
        codes: dict[int, int] = {}
        for _ in range(5000):
            with socket.create_connection(("127.0.0.1", sidecar.port), timeout=5) as sock:
                sock.sendall(b"GARBAGE\r\n\r\n")
                data = sock.recv(64)
                code = int(data[9:12]) if data.startswith(b"HTTP/") else 0
                codes[code] = codes.get(code, 0) + 1
        out["5000 invalid requests"] = {"answers": codes, "log_lines": sidecar.log_lines() - before}
        spool.rename(spool.parent / "moved")
        answers = [request(sidecar.port, path)[2] for path in ("/", "/api/v1/engines", "/readyz")]
        out["paths_or_os_errors_shown"] = sum(
            str(spool.parent).encode() in body or b"No such file" in body for body in answers
        )
        out["special_files"] = "fifo.json: not_regular_file (lstat, never opened)"
        out["refusals"] = sidecar.refusals()
        return out
    finally:
        sidecar.stop()


class Beats:
    """Rewrites the first four engines' files every second with a new heartbeat (new versions to render)."""

    def __init__(self, spool: Path) -> None:
        self.files = sorted(p for p in spool.iterdir() if p.name.startswith(("big-", "wide-")))[:4]
        self.documents = [json.loads(p.read_bytes()) for p in self.files]
        self.written = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for path, document in zip(self.files, self.documents, strict=True):
                document["heartbeat_at"] = time.time()
                temporary = path.with_name("." + path.name + ".tmp")
                temporary.write_text(json.dumps(document, separators=(",", ":")))
                temporary.rename(path)
                self.written += 1
            self.stop.wait(1)

    def end(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.written


def worst_load(base: Path) -> dict[str, Any]:
    """The worst admitted spool, four engines beating every second, 4 000 clients on /metrics for 30 s
    (as Prometheus asks: OpenMetrics, gzip) and three more reading / and /api/v1/engines."""
    spool = spool_dir(base, "worst")
    worst = write_worst_spool(spool)
    sidecar = Sidecar(spool)
    beats = Beats(spool)
    stop = threading.Event()
    pages = {"/": 0, "/api/v1/engines": 0}
    failed_pages = []

    def read_pages(path: str) -> None:
        while not stop.is_set():
            status = request(sidecar.port, path, timeout=30)[0]
            pages[path] += 1
            if status != 200:
                failed_pages.append(status)

    readers = [threading.Thread(target=read_pages, args=(path,)) for path in ("/", "/api/v1/engines", "/")]
    try:
        prober = Prober(sidecar.probe_port, 32)
        main_port = Prober(sidecar.port, 32)
        for reader in readers:
            reader.start()
        load = wrk(
            f"http://127.0.0.1:{sidecar.port}/metrics", 4000, 30, "Accept-Encoding: gzip",
            "Accept: application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2",
        )  # fmt: skip
        stop.set()
        for reader in readers:
            reader.join()
        written = beats.end()
        during = sidecar.stats()
        final = sidecar.metrics()
        exported = {s.labels["engine"] for s in final.all("modelkv_engine_up")}
        return {
            "spool": json.loads(describe(worst)),
            "wrk": load,
            "probe_port": prober.result(),
            "main_port_healthz": main_port.result(),
            "pages_read": pages,
            "pages_not_200": {str(code): failed_pages.count(code) for code in set(failed_pages)},
            "rss": f"{sidecar.start['rss_mib']:.0f} -> peak {during['peak_rss_mib']:.0f} MiB",
            "server_fds": during["fds"],
            "beats_written": written,
            "engines_exported_after": f"{len(exported)} of {len(worst.engines)}",
            "refusals": sidecar.refusals(),
        }
    finally:
        stop.set()
        beats.end()
        sidecar.stop()


def slow_readers(base: Path) -> dict[str, Any]:
    """The worst admitted spool, four engines beating every second, 256 clients asking for /metrics over 30 s
    (each another version of a 6 MB body) and never reading their answers."""
    spool = spool_dir(base, "slow")
    write_worst_spool(spool)
    sidecar = Sidecar(spool)
    beats = Beats(spool)
    sockets = []
    try:
        prober = Prober(sidecar.probe_port, 40)
        started = time.monotonic()
        for i in range(256):
            sock = socket.create_connection(("127.0.0.1", sidecar.port), timeout=5)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            sockets.append(sock)
            time.sleep(max(0.0, started + (i + 1) * 30 / 256 - time.monotonic()))
        time.sleep(5)
        during = sidecar.stats()
        return {
            "rss": f"{sidecar.start['rss_mib']:.0f} -> peak {during['peak_rss_mib']:.0f} MiB",
            "server_fds": during["fds"],
            "beats_written": beats.end(),
            "probe_port": prober.result(),
            "refusals": sidecar.refusals(),
        }
    finally:
        for sock in sockets:
            sock.close()
        beats.end()
        sidecar.stop()


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "one_file": finding_1_one_file,
    "heads": finding_2_3_heads,
    "connections": finding_4_connections,
    "text": finding_5_9_text,
    "probes": finding_6_probes,
    "data": finding_7_8_data,
    "negotiation": finding_10_negotiation,
    "rough_edges": finding_11_rough_edges,
    "worst_load": worst_load,
    "slow_readers": slow_readers,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.list:
        for name, scenario in SCENARIOS.items():
            print(f"{name:12} {scenario.__doc__}")
        return 0
    os.sched_setaffinity(0, {1})
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="modelkv-attack-") as base:
        for name in args.only.split(","):
            started, load = time.monotonic(), os.getloadavg()[0]
            results[name] = SCENARIOS[name](Path(base))
            results[name]["scenario_s"] = round(time.monotonic() - started, 1)
            results[name]["host_load_average"] = f"{load:.1f} -> {os.getloadavg()[0]:.1f}"
            print(f"== {name}: {SCENARIOS[name].__doc__}\n{json.dumps(results[name], indent=1, ensure_ascii=False)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
