"""A warning in the sidecar's log while its spool directory is missing, not a directory, or unreadable.

The sidecar has no readiness probe (it must never take the engine's pod out of service), so
``/readyz`` alone would keep a wrong ``--spool-dir`` quiet. One ``stat`` per check keeps it cheap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path

logger = logging.getLogger("modelkv_exporter.sidecar")

DEFAULT_CHECK_INTERVAL_SECONDS = 60.0


def spool_problem(directory: Path) -> str | None:
    """Why no snapshot can be read from ``directory``, or None when it is a directory we may list."""
    try:
        info = os.stat(directory)
    except FileNotFoundError:
        return "does not exist"
    except OSError as error:
        return f"cannot be read: {error.strerror or error}"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if not os.access(directory, os.R_OK | os.X_OK):
        return "cannot be listed: permission denied"
    return None


async def watch_spool(directory: Path, interval: float = DEFAULT_CHECK_INTERVAL_SECONDS) -> None:
    """Check ``directory`` now and every ``interval`` seconds: warn while it has a problem, say when it is gone."""
    previous: str | None = None
    while True:
        problem = spool_problem(directory)
        if problem:
            logger.warning(
                "spool directory %s %s: no engine snapshot can be read (check --spool-dir / MODELKV_SPOOL_DIR; "
                "the engine and the sidecar must share it); checking again in %.0f s",
                directory,
                problem,
                interval,
            )
        elif previous:
            logger.warning("spool directory %s is readable now", directory)
        previous = problem
        await asyncio.sleep(interval)
