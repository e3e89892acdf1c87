"""The extras a command needs beyond the base install, and the one line that says so when their libraries are missing.

The base install depends on nothing (it runs inside engines); ``serve`` and the demo need the ``sidecar`` extra,
the demo the ``torch`` extra too. The extra's libraries are read from the installed package's metadata, so
pyproject.toml stays their one definition.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

DISTRIBUTION = "modelkv-exporter"
SIDECAR = "sidecar"


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing_libraries(extra: str) -> list[str]:
    """The libraries ``extra`` names (for this platform) that are not installed; empty without the package's metadata."""
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    missing = []
    for requirement in requirements:
        name, _, marker = requirement.partition(";")
        if not re.search(rf"""extra\s*==\s*['"]{extra}['"]""", marker):
            continue
        if "sys_platform != 'win32'" in marker and sys.platform == "win32":
            continue
        found = re.match(r"[A-Za-z0-9._-]+", name.strip())
        if found and not _installed(found.group()):
            missing.append(found.group())
    return missing


def missing_extra(command: str, error: ModuleNotFoundError, extras: tuple[str, ...]) -> int:
    """Say in one line which libraries ``command`` lacks and how to install them; returns 2. Our own modules re-raise."""
    if not error.name or error.name.partition(".")[0] == "modelkv_exporter":
        raise error
    missing = [name for extra in extras for name in missing_libraries(extra)] or [error.name]
    print(
        f"modelkv-exporter {command}: {', '.join(missing)} not installed; "
        f"pip install '{DISTRIBUTION}[{','.join(extras)}]'",
        file=sys.stderr,
    )
    return 2
