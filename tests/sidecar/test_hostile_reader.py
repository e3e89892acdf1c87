"""What a hostile spool cannot do to the reader: make it open a special file, read without bound, or keep a
heartbeat from the future fresh (findings 6, 8 and 11 of the hardening issue)."""

from __future__ import annotations

import gc
import os
import socket
import stat
import time
import tracemalloc
from pathlib import Path

import pytest

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.reader import scan as scan_module
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.reader.state import CLOCK_SKEW_SECONDS, EngineState, classify
from modelkv_testbed.snapshots import make_snapshot


def special_files(spool: Path) -> list[str]:
    """A FIFO, a socket, a directory, a symbolic link and, where allowed, a character device, all named *.json."""
    os.mkfifo(spool / "fifo.json")
    with socket.socket(socket.AF_UNIX) as unix:
        unix.bind(str(spool / "socket.json"))
    (spool / "dir.json").mkdir()
    (spool / "link.json").symlink_to("/dev/zero")
    names = ["fifo.json", "socket.json", "dir.json", "link.json"]
    try:
        os.mknod(spool / "device.json", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
        names.append("device.json")
    except PermissionError:
        pass
    return names


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The base names of every file opened (writers' too: clear it before the scan)."""
    seen: list[str] = []
    real = os.open

    def recording(path: object, *args: object, **kwargs: object) -> int:
        seen.append(os.path.basename(os.fsdecode(path)))  # type: ignore[arg-type]
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scan_module.os, "open", recording)
    return seen


def test_special_files_are_rejected_by_their_lstat_type_unopened(spool: Path, opened: list[str]) -> None:
    write_snapshot(spool, make_snapshot("good"))
    names = special_files(spool)
    opened.clear()
    entries = {e.file_name: e for e in SpoolReader(spool).scan().entries}
    for name in names:
        assert entries[name].error is not None and entries[name].error.reason.value == "not_regular_file", name
    if "device.json" in names:
        assert "device" in entries["device.json"].error.detail
    assert opened == ["good.json"], "only the regular file was opened"


def test_without_the_lstat_check_the_reader_would_open_them(
    spool: Path, opened: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    names = special_files(spool)
    opened.clear()
    monkeypatch.setattr(scan_module, "_not_regular", lambda mode: None)
    SpoolReader(spool).scan()
    assert set(opened) >= set(names) - {"dir.json", "link.json"}, "the mechanism this guards, taken away"


def test_the_reader_reads_the_first_files_within_its_file_and_byte_budgets(spool: Path, opened: list[str]) -> None:
    stamp = float(int(time.time()))  # one heartbeat for all: files of one size (a float's digits vary)
    for i in range(12):
        write_snapshot(spool, make_snapshot(f"e{i:02}", heartbeat_at=stamp))
    size = (spool / "e00.json").stat().st_size
    assert {f.stat().st_size for f in spool.iterdir()} == {size}
    reader = SpoolReader(spool, max_spool_files=10, max_spool_bytes=8 * size)
    opened.clear()
    scan = reader.scan()
    assert [e.file_name for e in scan.entries] == [f"e{i:02}.json" for i in range(8)]
    assert scan.skipped == 4 and reader.rejections["over_budget"] == 4
    assert set(opened) == {f"e{i:02}.json" for i in range(8)}, "files past the budget are never opened"
    assert classify(scan, time.time(), 30, 0.0).counts[EngineState.REJECTED] == 4
    time.sleep(0.06)
    write_snapshot(spool, make_snapshot("zz-new"))
    reader.scan()
    assert reader.rejections["over_budget"] == 5, "each skipped file counted once"
    reader.scan()
    assert reader.rejections["over_budget"] == 5
    reader = SpoolReader(spool, max_spool_files=10, max_spool_bytes=100 * size)
    assert reader.scan().skipped == 3, "beyond max_spool_files"
    (spool / "a-big.json").write_bytes(b" " * (20 * size))
    reader = SpoolReader(spool, max_spool_files=100, max_spool_bytes=19 * size)
    scan = reader.scan()
    assert scan.skipped == 1 and len(scan.entries) == 13, "a file too big for the rest is passed over, not the rest"


def test_a_heartbeat_from_the_future_is_stale_until_the_clock_reaches_it(spool: Path) -> None:
    now = time.time()
    write_snapshot(spool, make_snapshot("decade", heartbeat_at=now + 10 * 365 * 86400, interval=5.0))
    write_snapshot(spool, make_snapshot("skewed", heartbeat_at=now + CLOCK_SKEW_SECONDS / 2, interval=5.0))
    write_snapshot(spool, make_snapshot("soon", heartbeat_at=now + 60))  # one-shot, a minute ahead
    view = classify(SpoolReader(spool).scan(), now, 30.0, 0.0)
    states = {item.snapshot.engine.engine_id: item.state for item in view.entries}
    assert states == {"decade": EngineState.STALE, "skewed": EngineState.EXPORTED, "soon": EngineState.STALE}
    assert view.until == pytest.approx(now + CLOCK_SKEW_SECONDS / 2 + 30.0, abs=0.01), "skewed goes stale first"
    later = classify(view.scan, now + 60, 30.0, 0.0)
    assert {i.snapshot.engine.engine_id: i.state for i in later.entries}["soon"] is EngineState.EXPORTED


def test_with_forgetting_on_a_future_heartbeat_is_reclassified_when_it_comes_due(spool: Path) -> None:
    """A stale engine's next change is usually its forget deadline; one from the future changes sooner."""
    now = time.time()
    write_snapshot(spool, make_snapshot("soon", heartbeat_at=now + 60))
    write_snapshot(spool, make_snapshot("decade", heartbeat_at=now + 10 * 365 * 86400, interval=5.0))
    view = classify(SpoolReader(spool).scan(), now, 30.0, 3600.0)
    assert {i.snapshot.engine.engine_id: i.state for i in view.entries} == {
        "soon": EngineState.STALE,
        "decade": EngineState.STALE,
    }
    assert view.until == pytest.approx(now + 60 - CLOCK_SKEW_SECONDS, abs=0.01), "not an hour later"
    later = classify(view.scan, view.until + 0.001, 30.0, 3600.0)
    assert {i.snapshot.engine.engine_id: i.state for i in later.entries}["soon"] is EngineState.EXPORTED


def test_a_rejected_file_does_not_keep_its_decoded_document(spool: Path) -> None:
    """The rejection outlives the parse; the parse's frames (and the document in them) must not."""
    (spool / "junk.json").write_bytes(b'{"junk":[' + b",".join([b"[]"] * 80_000) + b"]}")
    reader = SpoolReader(spool)
    tracemalloc.start()
    try:
        scan = reader.scan()
        gc.collect()
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (entry,) = scan.entries
    assert entry.error is not None and entry.error.__traceback__ is None
    assert retained < 512 * 1024, f"{retained} bytes retained after rejecting a 240 KB file"
