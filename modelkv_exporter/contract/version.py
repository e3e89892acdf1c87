"""The package's version: written once, in ``pyproject.toml``, and read here from the installed package's metadata.

Both sides stamp it where the other reads it: the engine into each snapshot's ``writer``, the
sidecar into ``modelkv_exporter_build_info``. Run from a checkout that was never installed
(``pip install .`` or ``-e .``), the package has no metadata, and its version is ``UNKNOWN``:
a version that sorts before every release and says where it came from.
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "modelkv-exporter"
UNKNOWN = "0+unknown"


def installed_version() -> str:
    """The version in the installed package's metadata, else ``UNKNOWN``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN


VERSION = installed_version()
"""This package's version (``installed_version()`` when first imported)."""
