"""The spool directory shared by engine processes and the sidecar: file names and the atomic writer.

Writers put one ``<engine>.json`` per engine process, atomically (temp file in the same
directory, fsync, ``os.replace``, fsync of the directory), so a reader sees the old document
or the new one, never a torn one. The sidecar's reader (``sidecar.reader.scan``) is the reading side.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from modelkv_exporter.contract.snapshot import Snapshot

SUFFIX = ".json"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def snapshot_file_name(engine_id: str) -> str:
    """The spool file name for an engine id: readable, safe, and distinct per id."""
    safe = _UNSAFE.sub("_", engine_id).lstrip(".") or "engine"
    if safe != engine_id or len(safe) > 180:
        safe = f"{safe[:180]}-{hashlib.sha256(engine_id.encode('utf-8')).hexdigest()[:10]}"
    return safe + SUFFIX


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
