"""Issue 49: the publisher holds its engine's liveness lock while it writes, so a reader tells a killed engine (no
holder: ``writer_alive`` False) from a live one (True); an engine that ended lets go. Publishers run in real
processes here: the lock is the kernel's, and only another process's view of it counts."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from modelkv_exporter.contract.spool import alive_file_name, hold_alive, let_go_alive, snapshot_file_name, writer_alive
from modelkv_exporter.engine import engine_log
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_testbed import ROOT

ENGINE = "liveness-e0"

PUBLISHER = textwrap.dedent(
    """
    import sys, time
    from torch import nn
    from modelkv_exporter.engine.heartbeat import SnapshotPublisher
    from modelkv_exporter.engine.publish import build_snapshot
    from modelkv_exporter.engine.samplers import sample_host_memory

    publisher = SnapshotPublisher(sys.argv[1], build_snapshot(nn.Module(), max_num_seqs=1, engine_id=sys.argv[2]))
    publisher.set_baseline(sample_host_memory())
    publisher.start_heartbeat(0.2, sample_host_memory)
    print("WRITING", flush=True)
    if sys.stdin.readline().strip() == "end":
        publisher.end()
        print("ENDED", flush=True)
        sys.stdin.readline()
    """
)


def publisher_process(spool: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, str(spool), ENGINE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testbed")])},
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "WRITING"
    return process


def alive(spool: Path) -> bool | None:
    return writer_alive(spool / alive_file_name(ENGINE))


def test_a_live_publisher_reads_alive_and_a_killed_one_reads_gone(spool: Path) -> None:
    process = publisher_process(spool)
    try:
        assert alive(spool) is True
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        assert alive(spool) is False, "the kernel let go of a SIGKILLed engine's lock"
        assert (spool / snapshot_file_name(ENGINE)).exists(), "its last snapshot stays, not ended"
    finally:
        process.kill()
        process.wait()


def test_a_publisher_that_ended_lets_go_while_its_process_lives(spool: Path) -> None:
    process = publisher_process(spool)
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write("end\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "ENDED"
        assert process.poll() is None
        assert alive(spool) is False
    finally:
        process.kill()
        process.wait()


def test_a_lock_another_process_holds_is_logged_once_and_the_snapshot_is_written_anyway(
    spool: Path, tmp_path: Path
) -> None:
    """The lock is taken without waiting (``LOCK_NB``): taken elsewhere, the publisher writes on without it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
         " fcntl.flock(fd, fcntl.LOCK_EX); print('HELD', flush=True); sys.stdin.readline()",
         str(spool / alive_file_name(ENGINE))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    engine_log.flush()
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
        publisher = SnapshotPublisher(spool, build_snapshot(_module(), max_num_seqs=1, engine_id=ENGINE))
        for _ in range(3):
            publisher.write()
        assert not publisher.holds_alive
        assert (spool / snapshot_file_name(ENGINE)).exists()
        lines = [entry for entry in engine_log._pending if "liveness lock" in entry[2]]
        assert len(lines) == 1, "logged once"
        publisher.end()
    finally:
        engine_log.flush()
        holder.kill()
        holder.wait()


def test_the_lock_is_taken_at_the_first_write_and_let_go_at_stop(spool: Path) -> None:
    publisher = SnapshotPublisher(spool, build_snapshot(_module(), max_num_seqs=1, engine_id=ENGINE))
    assert not publisher.holds_alive and not (spool / alive_file_name(ENGINE)).exists()
    publisher.write()
    assert publisher.holds_alive
    fd = os.open(spool / alive_file_name(ENGINE), os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    publisher.stop()
    assert not publisher.holds_alive
    let_go_alive(hold_alive(spool, ENGINE))  # nobody holds it after stop: this process takes it at once


def _module() -> object:
    from torch import nn

    return nn.Module()
