"""What production does to an exporter: writers killed mid-write, restarts, a full spool, and load.

Each test runs at a quick size here; bench/reliability.sh runs them at full size
(MODELKV_TEST_SCALE=full: 1 000 kills, 60 s of load) and prints the figures.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from modelkv_exporter.contract.snapshot import MemorySample
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_testbed import ROOT
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.polling import eventually
from modelkv_testbed.processes import Sidecar, start_sidecar, stop_process
from modelkv_testbed.snapshots import make_declaration, make_snapshot
from tests.support import FULL_SCALE

KILLS = 1000 if FULL_SCALE else 100
LOAD_SECONDS = 60.0 if FULL_SCALE else 5.0
LOAD_CLIENTS = 16

WRITER = """
import json, sys
from modelkv_exporter.sidecar.reader.decode import parse_snapshot
from modelkv_exporter.contract.spool import write_snapshot
spool, versions, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
snapshots = [parse_snapshot(json.dumps(v).encode()) for v in json.load(open(versions))]
print("ready", flush=True)
i = start
while True:
    write_snapshot(spool, snapshots[i % len(snapshots)])
    i += 1
"""


def victim_versions(path: Path) -> str:
    """32 versions of one engine's snapshot, each resolved at another max_num_seqs, as a JSON file for the writer."""
    versions = [
        make_snapshot(
            "victim", declarations=tuple(make_declaration(f"c{j}", max_num_seqs=n) for j in range(20)), max_num_seqs=n
        ).to_dict()
        for n in range(1, 33)
    ]
    path.write_text(json.dumps(versions))
    return str(path)


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in Exposition(text)}


def consistent_victim(text: str) -> int:
    """The victim's max_num_seqs, after checking every declaration was resolved at it (no mixed versions)."""
    found = families(text)
    (mns,) = [s.value for s in found["modelkv_engine_max_num_seqs"] if s.labels["engine"] == "victim"]
    rows = {s.value for s in found["modelkv_declared_rows"] if s.labels["engine"] == "victim"}
    assert rows == {mns}, f"declarations of another version: rows {rows}, max_num_seqs {mns}"
    assert sum(s.value for s in found["modelkv_exporter_snapshot_rejections"]) == 0, "a torn file was read"
    return int(mns)


class Scraper(threading.Thread):
    """Scrapes /metrics in a loop and checks every body."""

    def __init__(self, sidecar: Sidecar) -> None:
        super().__init__(daemon=True)
        self.sidecar = sidecar
        self.stop = threading.Event()
        self.scrapes = 0
        self.failures: list[str] = []

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                try:
                    response = client.get(self.sidecar.url + "/metrics")
                    assert response.status_code == 200, response.status_code
                    consistent_victim(response.text)
                except Exception as error:
                    self.failures.append(repr(error))
                self.scrapes += 1


@pytest.fixture
def running(spool: Path) -> Iterator[Sidecar]:
    sidecar = start_sidecar(spool)
    yield sidecar
    stop_process(sidecar.process)


def test_writers_killed_mid_write_never_tear_a_scrape(running: Sidecar, spool: Path, tmp_path: Path) -> None:
    write_snapshot(spool, make_snapshot("victim", declarations=(make_declaration(max_num_seqs=8),), max_num_seqs=8))
    scraper = Scraper(running)
    scraper.start()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    versions = victim_versions(tmp_path / "versions.json")
    rng = random.Random(7)
    started = time.monotonic()
    for kill in range(KILLS):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(spool), versions, str(kill)], stdout=subprocess.PIPE, env=env, cwd=ROOT
        )
        assert writer.stdout is not None and writer.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0, 0.01))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    elapsed = time.monotonic() - started
    scraper.stop.set()
    scraper.join()
    orphans = [p.name for p in spool.iterdir() if p.name.endswith(".tmp")]
    on_disk = consistent_victim(running.get("/metrics").text)
    print(
        f"\n{KILLS} writers killed in {elapsed:.1f}s; {scraper.scrapes} scrapes, {len(scraper.failures)} failures; "
        f"{len(orphans)} orphaned temp files"
    )
    assert scraper.failures == [] and scraper.scrapes > KILLS // 10
    assert on_disk in range(1, 33), "the last good snapshot stays exported"
    publisher = SnapshotPublisher(spool, make_snapshot("victim"))
    assert not [p for p in spool.iterdir() if p.name.endswith(".tmp")], "a restarted writer removes its orphans"
    publisher.stop()


def test_restart_with_the_same_engine_id_replaces_its_series(running: Sidecar, spool: Path) -> None:
    before = make_snapshot("e", declarations=(make_declaration("before"),))
    write_snapshot(spool, replace(before, started_at=before.started_at - 100))
    assert 'cache="before"' in running.get("/metrics").text
    restarted = make_snapshot("e", declarations=(make_declaration("after"),))
    write_snapshot(spool, restarted)
    text = running.get("/metrics").text
    assert 'cache="after"' in text and 'cache="before"' not in text
    (start,) = [s.value for s in families(text)["modelkv_engine_start_time_seconds"]]
    assert start == restarted.started_at > before.started_at - 100


def test_a_second_engine_appears_and_disappears(running: Sidecar, spool: Path) -> None:
    write_snapshot(spool, make_snapshot("one"))
    second = SnapshotPublisher(spool, make_snapshot("two"))
    second.write()
    up = {s.labels["engine"] for s in families(running.get("/metrics").text)["modelkv_engine_up"]}
    assert up == {"one", "two"}
    second.end()
    found = families(running.get("/metrics").text)
    assert {s.labels["engine"] for s in found["modelkv_engine_up"]} == {"one"}
    assert {s.labels["state"]: s.value for s in found["modelkv_exporter_spool_files"]}["ended"] == 1
    (spool / "two.json").unlink()
    found = families(running.get("/metrics").text)
    assert {s.labels["state"]: s.value for s in found["modelkv_exporter_spool_files"]}["ended"] == 0


def test_a_sidecar_restarted_over_a_full_spool_exports_everything_at_once(spool: Path) -> None:
    engines = 200
    for i in range(engines):
        write_snapshot(spool, make_snapshot(f"e{i:03}", declarations=(make_declaration("a"), make_declaration("b"))))
    first = start_sidecar(spool)
    stop_process(first.process)
    started = time.monotonic()
    second = start_sidecar(spool)
    try:
        found = families(second.get("/metrics").text)
        ready = time.monotonic() - started
        assert len(found["modelkv_engine_up"]) == engines and len(found["modelkv_declared_peak_bytes"]) == 2 * engines
        print(f"\nrestart over {engines} snapshots: first full scrape {ready:.2f}s after start")
    finally:
        stop_process(second.process)


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path | None]:
    """A 64 KiB tmpfs when this machine lets us mount one, else None (the test then simulates ENOSPC)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)], capture_output=True)
    if mounted.returncode != 0:
        yield None
        return
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_spool_makes_the_engine_log_and_go_on_and_keeps_the_last_good_snapshot(
    small_filesystem: Path | None, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = small_filesystem or tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    sidecar = start_sidecar(spool)
    publisher = SnapshotPublisher(spool, make_snapshot("e", interval=0.1))
    try:
        publisher.set_baseline(MemorySample(time.time(), {"process_resident": 1}))
        assert 'engine="e"' in sidecar.get("/metrics").text
        filler = spool / "filler.bin"
        if small_filesystem is not None:
            with open(filler, "wb", buffering=0) as handle:
                with pytest.raises(OSError) as full:
                    while True:
                        handle.write(b"\0" * 4096)
            assert full.value.errno == errno.ENOSPC
        else:

            def no_space(fd: int) -> None:
                raise OSError(errno.ENOSPC, "No space left on device (simulated)")

            monkeypatch.setattr("modelkv_exporter.contract.spool.os.fsync", no_space)
        beats: list[float] = []

        def sample() -> MemorySample:
            beats.append(time.time())
            return MemorySample(time.time(), {"process_resident": 2})

        with caplog.at_level(logging.WARNING, logger="vllm.modelkv_exporter.heartbeat"):
            publisher.start_heartbeat(0.05, sample)
            eventually(lambda: len(beats) >= 5, "five failing beats", timeout=10)
        warnings = [r for r in caplog.records if "cannot refresh snapshot" in r.getMessage()]
        assert len(warnings) == 1, "logged once, not on every beat"
        eventually(
            lambda: not [p for p in spool.iterdir() if p.name.endswith(".tmp")],
            "no partial file left behind (a beat's own, while it writes, is gone when it fails)",
            timeout=10,
        )
        text = sidecar.get("/metrics").text
        assert 'modelkv_memory_process_resident_bytes{engine="e",model="m",stage=""} 1.0' in text, "last good"
        if small_filesystem is not None:
            filler.unlink()
        else:
            monkeypatch.undo()
        eventually(
            lambda: (
                'modelkv_memory_process_resident_bytes{engine="e",model="m",stage=""} 2.0'
                in sidecar.get("/metrics").text
            ),
            "the heartbeat to recover once there is room",
            timeout=10,
        )
        print(f"\nfull spool: {'a real 64 KiB tmpfs' if small_filesystem else 'simulated ENOSPC'}")
    finally:
        publisher.stop()
        stop_process(sidecar.process)


def rss_kib(pid: int) -> int:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0])


def test_concurrent_scrapes_while_writers_update(running: Sidecar, spool: Path) -> None:
    publishers = [
        SnapshotPublisher(
            spool, make_snapshot(f"w{i}", declarations=tuple(make_declaration(f"c{j}") for j in range(50)))
        )
        for i in range(4)
    ]
    for publisher in publishers:
        publisher.write()
        publisher.start_heartbeat(
            1.0, lambda: MemorySample(time.time(), {"process_resident": random.randrange(1 << 30)})
        )
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + LOAD_SECONDS

    def client(gzip_too: bool) -> None:
        headers = {"Accept-Encoding": "gzip"} if gzip_too else {"Accept-Encoding": "identity"}
        with httpx.Client(timeout=10, headers=headers) as http:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    response = http.get(running.url + "/metrics")
                    ok = response.status_code == 200 and 'modelkv_engine_up{engine="w3"' in response.text
                except httpx.HTTPError as error:
                    ok, response = False, error  # type: ignore[assignment]
                with lock:
                    latencies.append(time.perf_counter() - started)
                    if not ok:
                        errors.append(repr(response))

    for _ in range(3):
        running.get("/metrics")
    rss_start = rss_kib(running.process.pid)
    threads = [threading.Thread(target=client, args=(i % 2 == 0,)) for i in range(LOAD_CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rss_end = rss_kib(running.process.pid)
    for publisher in publishers:
        publisher.stop()
    latencies.sort()
    p50, p99 = statistics.median(latencies), latencies[int(len(latencies) * 0.99)]
    print(
        f"\nload: {LOAD_CLIENTS} clients for {LOAD_SECONDS:.0f}s, {len(latencies)} scrapes, {len(errors)} errors, "
        f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, sidecar RSS {rss_start // 1024} -> {rss_end // 1024} MiB"
    )
    assert errors == []
    assert rss_end - rss_start < 16 * 1024, "RSS stays flat under load"
