"""The hook's settings, read from the environment through the one settings table."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from modelkv_exporter.contract.settings import DEFAULT_SAMPLE_INTERVAL, ENGINE, from_environ
from modelkv_exporter.engine.log import get_logger

logger = get_logger("config")


@dataclass(frozen=True)
class HookConfig:
    """The engine-side settings (``MODELKV_SPOOL_DIR``, ``MODELKV_SAMPLE_INTERVAL``, ``MODELKV_ENGINE_ID``,
    ``MODELKV_OBSERVE``)."""

    spool_dir: Path
    sample_interval: float = DEFAULT_SAMPLE_INTERVAL
    engine_id_prefix: str | None = None
    observe: bool = True

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> HookConfig | None:
        """None when ``MODELKV_SPOOL_DIR`` is unset (the plugin then stays inactive).

        A malformed variable is logged and its default kept: the engine never fails to start because of us.
        """
        values, problems = from_environ(ENGINE, os.environ if environ is None else environ)
        for problem in problems.values():
            logger.warning("modelkv: %s; using the default", problem)
        if not values["spool_dir"]:
            return None
        return cls(Path(values["spool_dir"]), values["sample_interval"], values["engine_id"] or None, values["observe"])
