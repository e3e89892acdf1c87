"""Reading the spool: every snapshot file parsed once per change, every bad file rejected with a reason.

The reader parses only files whose inode, size or times changed since the last scan, never
follows links, never opens anything ``lstat`` does not call a regular file, and never blocks
on FIFOs. It reads snapshot files in name order, at most ``max_spool_files`` of them and
``max_spool_bytes`` in all (a file that does not fit is passed over); the rest are counted as
rejected (``over_budget``), not read. Each version of a file it parses gets a number of its own
(``SpoolEntry.version``), so a consumer can cache whatever it derives from an entry by
``(file_name, version)``.
"""

from __future__ import annotations

import collections
import itertools
import operator
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from modelkv_exporter.contract.setting_values import byte_size, positive_int
from modelkv_exporter.contract.settings import setting
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.spool import SUFFIX, snapshot_file_name
from modelkv_exporter.sidecar.reader.decode import RejectReason, SnapshotError, parse_snapshot

FULL_SCAN_EVERY_SECONDS = 1.0
SETTLE_NS = 50_000_000
"""Directory timestamps are as coarse as the kernel's tick (1 to 10 ms); 50 ms is well past it."""


def read_snapshot_file(path: str | os.PathLike[str], max_bytes: int) -> Snapshot:
    """Read and parse one snapshot file without following links or blocking."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        if os.path.islink(path):
            raise SnapshotError(RejectReason.NOT_REGULAR_FILE, "is a symbolic link") from None
        raise SnapshotError(RejectReason.UNREADABLE, error.strerror or str(error)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SnapshotError(RejectReason.NOT_REGULAR_FILE, "is not a regular file")
        if info.st_size > max_bytes:
            raise SnapshotError(RejectReason.TOO_LARGE, f"{info.st_size} bytes > limit {max_bytes}")
        chunks: list[bytes] = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as error:
        raise SnapshotError(RejectReason.UNREADABLE, error.strerror or str(error)) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise SnapshotError(RejectReason.TOO_LARGE, f"grew past limit {max_bytes} while read")
    try:
        return parse_snapshot(data)
    except SnapshotError:
        raise
    except Exception as error:  # a backstop: nothing in a file may escape as another type
        raise SnapshotError(RejectReason.INVALID_SNAPSHOT, f"{type(error).__name__}: {error}") from None


@dataclass(frozen=True)
class SpoolEntry:
    """One spool file as last read: a snapshot or the reason it was rejected.

    ``version`` numbers each read of a file within one reader: an entry with the same file
    name and version holds the same snapshot.
    """

    file_name: str
    mtime: float
    snapshot: Snapshot | None = None
    error: SnapshotError | None = None
    version: int = 0


@dataclass(frozen=True)
class SpoolScan:
    """The spool as seen by one scan. ``error`` is set when the directory could not be listed."""

    entries: tuple[SpoolEntry, ...] = ()
    error: str | None = None
    skipped: int = 0
    """Snapshot files past the reader's ``max_spool_files`` or ``max_spool_bytes``: counted as rejected, never read."""

    @property
    def ok(self) -> bool:
        """Whether the directory itself could be listed."""
        return self.error is None

    @property
    def snapshots(self) -> list[tuple[SpoolEntry, Snapshot]]:
        """Entries holding a usable snapshot, in file-name order."""
        return [(entry, entry.snapshot) for entry in self.entries if entry.snapshot is not None]


_FileKey = tuple[int, int, int, int]
Admit = Callable[[Snapshot], None]
"""A check of a parsed snapshot that raises ``SnapshotError`` to reject it (the sidecar's budgets)."""


@dataclass(frozen=True)
class SpoolLimits:
    """How much of the spool one scan reads; each a setting."""

    max_snapshot_bytes: int = setting(256 * 1024, byte_size, "Snapshot files larger than this are rejected unread.")
    """Parsing a document costs up to about 22 times its size in transient memory (many small JSON values) and
    holds the interpreter for about 75 ms at this size; a snapshot of 256 declarations is about 100 KiB."""

    max_spool_files: int = setting(
        256,
        positive_int,
        "Snapshot files read per scan, the first by name; the others are counted as rejected (over_budget), not read.",
    )
    """One per engine process in the pod, with room to spare."""

    max_spool_bytes: int = setting(
        4 * 1024 * 1024,
        byte_size,
        "Bytes of snapshot files read per scan, the first files by name; the others are counted as rejected "
        "(over_budget), not read.",
    )
    """64 engines of 250 declarations each fit."""

    def reader(self, directory: Path, admit: Admit | None = None) -> SpoolReader:
        """A reader of ``directory`` within these limits; ``admit`` checks each parsed snapshot."""
        return SpoolReader(directory, self.max_snapshot_bytes, self.max_spool_files, self.max_spool_bytes, admit)


_name = operator.attrgetter("name")
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> SnapshotError | None:
    """Why an ``lstat`` mode is no snapshot file, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return SnapshotError(RejectReason.NOT_REGULAR_FILE, "is a symbolic link")
    kind = next((name for test, name in _KINDS if test(mode)), "a device or other special file")
    return SnapshotError(RejectReason.NOT_REGULAR_FILE, f"is {kind}, not a regular file")


@dataclass
class SpoolReader:
    """Scans a spool directory, re-parsing only files that changed since the last scan.

    ``rejections`` counts each rejected file version once, by reason, for the life of the
    reader (it becomes a counter metric). Thread-safe. ``max_snapshot_bytes``, ``max_spool_files`` and
    ``max_spool_bytes`` are ``SpoolLimits``' (``SpoolLimits.reader`` makes one). ``admit`` checks each
    parsed file version once and may reject it. ``monotonic`` and ``wall_ns`` are the clocks of the
    unchanged-directory shortcut, injectable for tests.
    """

    directory: Path
    max_snapshot_bytes: int = SpoolLimits.max_snapshot_bytes
    max_spool_files: int = SpoolLimits.max_spool_files
    max_spool_bytes: int = SpoolLimits.max_spool_bytes
    admit: Admit | None = None
    full_scan_every: float = FULL_SCAN_EVERY_SECONDS
    monotonic: Callable[[], float] = time.monotonic
    wall_ns: Callable[[], int] = time.time_ns
    rejections: collections.Counter[str] = field(default_factory=collections.Counter)
    _cache: dict[str, tuple[_FileKey, SpoolEntry]] = field(default_factory=dict)
    _duplicates: set[tuple[str, _FileKey]] = field(default_factory=set)
    _skipped: set[int] = field(default_factory=set)
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last: tuple[tuple[int, int, int], float, SpoolScan] | None = None

    def scan(self) -> SpoolScan:
        """The spool's current state: every snapshot file, as of now.

        A writer replaces a snapshot by renaming into the directory, which updates the
        directory's mtime. When the directory's stat is unchanged, its mtime was already older
        than the file system's timestamp granularity (``SETTLE_NS``) at the last full scan, and
        that scan is under ``full_scan_every`` seconds old, the last scan is returned without
        listing. The periodic full scan bounds how long a file changed in place (not by rename,
        so not by our writers) can go unseen.
        """
        with self._lock:
            now = self.monotonic()
            try:
                info = os.stat(self.directory)
            except OSError as error:
                self._cache.clear()
                self._last = None
                return SpoolScan(error=f"{self.directory}: {error.strerror or error}")
            key = (info.st_ino, info.st_mtime_ns, info.st_ctime_ns)
            last = self._last
            if last is not None and last[0] == key and now - last[1] < self.full_scan_every:
                return last[2]
            scan = self._full_scan()
            settled = self.wall_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > SETTLE_NS
            self._last = (key, now, scan) if settled and scan.ok else None
            return scan

    def count(self, reason: RejectReason, files: int = 1) -> None:
        """Count ``files`` file versions rejected for ``reason`` by a consumer of the scans (the sidecar's budgets)."""
        with self._lock:
            self.rejections[reason.value] += files

    def _full_scan(self) -> SpoolScan:
        try:
            listing = sorted(
                (e for e in os.scandir(self.directory) if e.name.endswith(SUFFIX) and not e.name.startswith(".")),
                key=_name,
            )
        except OSError as error:
            self._cache.clear()
            return SpoolScan(error=f"{self.directory}: {error.strerror or error}")
        read, beyond = self._within_budget(listing)
        fresh: dict[str, tuple[_FileKey, SpoolEntry]] = {}
        for dir_entry in read:
            fresh[dir_entry.name] = self._entry(dir_entry)
        self._cache = fresh
        skipped = self._count_skipped(beyond)
        return SpoolScan(entries=self._resolve_duplicates([entry for _, entry in fresh.values()]), skipped=skipped)

    def _within_budget(self, listing: list[os.DirEntry[str]]) -> tuple[list[os.DirEntry[str]], list[os.DirEntry[str]]]:
        """The files to read and the rest: in name order, each file whose ``lstat`` size still fits in
        ``max_spool_bytes`` (a larger one is passed over, not the ones after it), ``max_spool_files`` at most."""
        read: list[os.DirEntry[str]] = []
        beyond: list[os.DirEntry[str]] = []
        total = 0
        for index, dir_entry in enumerate(listing):
            if len(read) >= self.max_spool_files:
                return read, beyond + listing[index:]
            size = 0
            try:
                info = dir_entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_size <= self.max_snapshot_bytes:
                    size = info.st_size
            except OSError:
                pass
            if total + size > self.max_spool_bytes:
                beyond.append(dir_entry)
            else:
                total += size
                read.append(dir_entry)
        return read, beyond

    def _count_skipped(self, beyond: list[os.DirEntry[str]]) -> int:
        """Files past the budget, none opened or even stat'ed: each counted once as over budget while it stays
        past it (by name: tens of thousands of files cost a listing, not a stat each)."""
        names = {hash(dir_entry.name) for dir_entry in beyond}
        self.rejections[RejectReason.OVER_BUDGET.value] += len(names - self._skipped)
        self._skipped = names
        return len(beyond)

    def _entry(self, dir_entry: os.DirEntry[str]) -> tuple[_FileKey, SpoolEntry]:
        try:
            info = dir_entry.stat(follow_symlinks=False)
        except OSError as error:
            return (0, 0, 0, 0), self._reject(dir_entry.name, 0.0, SnapshotError(RejectReason.UNREADABLE, str(error)))
        key = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        cached = self._cache.get(dir_entry.name)
        if cached is not None and cached[0] == key:
            return cached
        unfit = _not_regular(info.st_mode)
        if unfit is None and info.st_size > self.max_snapshot_bytes:
            unfit = SnapshotError(RejectReason.TOO_LARGE, f"{info.st_size} bytes > limit {self.max_snapshot_bytes}")
        if unfit is not None:
            return key, self._reject(dir_entry.name, info.st_mtime, unfit)
        try:
            snapshot = read_snapshot_file(dir_entry.path, self.max_snapshot_bytes)
            if self.admit is not None:
                self.admit(snapshot)
        except SnapshotError as error:
            return key, self._reject(dir_entry.name, info.st_mtime, error)
        return key, SpoolEntry(dir_entry.name, info.st_mtime, snapshot=snapshot, version=next(self._versions))

    def _reject(self, name: str, mtime: float, error: SnapshotError) -> SpoolEntry:
        # Kept for as long as the file: without its traceback, which holds the parse's frames and with
        # them the whole decoded document (a 256 KiB file of small values is megabytes of objects).
        error.__traceback__ = error.__context__ = error.__cause__ = None
        self.rejections[error.reason.value] += 1
        return SpoolEntry(name, mtime, error=error, version=next(self._versions))

    def _resolve_duplicates(self, entries: list[SpoolEntry]) -> tuple[SpoolEntry, ...]:
        """Keep one file per engine id: the one named for it, else the latest heartbeat."""
        by_engine: dict[str, list[SpoolEntry]] = collections.defaultdict(list)
        for entry in entries:
            if entry.snapshot is not None:
                by_engine[entry.snapshot.engine.engine_id].append(entry)
        losers: dict[str, str] = {}
        for engine_id, claimants in by_engine.items():
            if len(claimants) < 2:
                continue
            own = snapshot_file_name(engine_id)
            winner = max(claimants, key=lambda e: (e.file_name == own, e.snapshot.heartbeat_at, e.file_name))  # type: ignore[union-attr]
            for entry in claimants:
                if entry is not winner:
                    losers[entry.file_name] = winner.file_name
        versions = {(name, self._cache[name][0]) for name in losers if name in self._cache}
        self.rejections[RejectReason.DUPLICATE_ENGINE.value] += len(versions - self._duplicates)
        self._duplicates = versions
        return tuple(
            SpoolEntry(
                e.file_name,
                e.mtime,
                error=SnapshotError(RejectReason.DUPLICATE_ENGINE, f"same engine id as {losers[e.file_name]}"),
                version=e.version,
            )
            if e.file_name in losers
            else e
            for e in entries
        )
