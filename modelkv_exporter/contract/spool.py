"""The spool directory shared by engine processes and the sidecar: file names and the atomic writer.

Writers put one ``<engine>.json`` per engine process, atomically (temp file in the same
directory, fsync, ``os.replace``, fsync of the directory), so a reader sees the old document
or the new one, never a torn one. The sidecar's reader (``sidecar.reader.scan``) is the reading side.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import tempfile
from pathlib import Path

from modelkv_exporter.contract.snapshot import Snapshot

SUFFIX = ".json"
ALIVE_SUFFIX = ".alive"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def snapshot_file_name(engine_id: str) -> str:
    """The spool file name for an engine id: readable, safe, and distinct per id."""
    safe = _UNSAFE.sub("_", engine_id).lstrip(".") or "engine"
    if safe != engine_id or len(safe) > 180:
        safe = f"{safe[:180]}-{hashlib.sha256(engine_id.encode('utf-8')).hexdigest()[:10]}"
    return safe + SUFFIX


def alive_file_name(engine_id: str) -> str:
    """The name of the engine's liveness file beside its snapshot (``<engine>.alive``)."""
    return snapshot_file_name(engine_id)[: -len(SUFFIX)] + ALIVE_SUFFIX


def hold_alive(spool_dir: str | os.PathLike[str], engine_id: str) -> int:
    """Take the engine's liveness lock in ``spool_dir`` and return its descriptor; ``let_go_alive`` lets go.

    An exclusive ``flock`` on ``<engine>.alive``, taken without waiting: the kernel drops it when the process ends,
    however it ends (SIGKILL and the kernel's OOM killer included), so ``writer_alive`` tells a killed engine from a
    hung one. A child forked later closes its copy at once (``os.register_at_fork``), so it cannot keep a dead engine
    alive. Raises ``OSError`` when the file cannot be made or another process holds it.
    """
    path = Path(spool_dir) / alive_file_name(engine_id)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    if not _held:
        os.register_at_fork(after_in_child=_close_held_in_child)
    _held.add(fd)
    return fd


def let_go_alive(fd: int) -> None:
    """Let go of a liveness lock ``hold_alive`` took (the engine ended: its snapshot says so)."""
    _held.discard(fd)
    os.close(fd)


_held: set[int] = set()
"""Liveness descriptors this process holds; a forked child closes them."""


def _close_held_in_child() -> None:
    for fd in _held:
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


def writer_alive(alive_file: str | os.PathLike[str]) -> bool | None:
    """Whether a process holds the liveness lock of ``alive_file``: True, False (none does: the writer is gone), or
    None when it cannot be told (no such file: an older writer; a file system without ``flock``).

    Asks with a shared lock on a descriptor of its own, taken and let go at once without waiting; needs only read
    access, so a read-only mount of the spool can ask, and asking never lets go of a lock this process holds.
    """
    try:
        fd = os.open(alive_file, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        return True if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
    finally:
        os.close(fd)
    return False


def write_snapshot(spool_dir: str | os.PathLike[str], snapshot: Snapshot) -> Path:
    """Write ``snapshot`` atomically into ``spool_dir`` and return its path.

    A missing spool directory (or a file in its place) raises ``FileNotFoundError`` or
    ``NotADirectoryError`` naming the directory; it is never created here, since a directory
    the sidecar does not share would hide the snapshot.
    """
    directory = Path(spool_dir)
    target = directory / snapshot_file_name(snapshot.engine.engine_id)
    data = snapshot.to_json()
    try:
        fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{target.stem}.", suffix=".tmp")
    except (FileNotFoundError, NotADirectoryError) as error:
        what = "does not exist" if isinstance(error, FileNotFoundError) else "is not a directory"
        raise type(error)(
            error.errno, f"spool directory {what} (create it, or give the directory the sidecar reads)", str(directory)
        ) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), 0o644)
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    _fsync_directory(directory)
    return target


def remove_orphaned_temp_files(spool_dir: str | os.PathLike[str], engine_id: str) -> int:
    """Delete temp files an earlier writer of ``engine_id`` left when it was killed mid-write; returns how many.

    Called once when a publisher starts, so a crash-looping engine does not fill a small spool.
    """
    own = re.compile(rf"\.{re.escape(Path(snapshot_file_name(engine_id)).stem)}\.[a-z0-9_]{{8}}\.tmp")
    removed = 0
    try:
        names = os.listdir(spool_dir)
    except OSError:
        return 0
    for name in names:
        if own.fullmatch(name):
            try:
                os.unlink(os.path.join(spool_dir, name))
                removed += 1
            except OSError:
                pass
    return removed


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
