"""The engine side's settings: one typed object read from ``MODELKV_`` variables (the engine owns the command line).

``TABLE`` is what the engine reads: ``MODELKV_SPOOL_DIR`` (which turns the hook on), then every
setting of ``HookConfig`` (discovery's are its ``DiscoverySettings``, which ``engine.discover`` reads as they
are). Every variable is read here and nowhere else. A malformed variable is logged and its default kept: the
engine never fails to start because of us.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelkv_exporter.contract.setting_values import interval_seconds, non_negative_int, positive_int, switch
from modelkv_exporter.contract.settings import Table, build, group, setting
from modelkv_exporter.engine.engine_log import get_logger

logger = get_logger("config")


@dataclass(frozen=True)
class DiscoverySettings:
    """The engine's settings that concern discovery: how often it takes a census, how far one goes, what it
    publishes. Part of ``HookConfig`` (``HookConfig.discovery``); its defaults are the engine's."""

    discover_read_locals: bool = setting(
        False,
        switch,
        "Attribute discovered cache layers by reading the locals of the frames on the stack (1 or 0), as earlier "
        "versions did: follows a cache handed under any argument name and tells caches apart exactly, but on "
        "CPython 3.11 keeps the tensors those frames delete later alive until they return, and costs more per new "
        "layer the deeper the caller's stack. Off: frames are matched by their code alone.",
    )
    census_interval: float = setting(
        30.0,
        interval_seconds,
        "Seconds between two censuses of the tensors the model's modules hold (at least 1); the census runs on "
        "the heartbeat thread, at the first heartbeat after this much time.",
    )
    discover_floor_bytes: int = setting(
        1 << 20,
        non_negative_int,
        "Bytes a discovered owner must have held at once to be published; smaller ones (rotary tables, "
        "scales) are only counted.",
    )
    engine_max_discovered_owners: int = setting(
        32,
        non_negative_int,
        "Discovered owners one engine publishes at most (the largest first); the rest are counted. The sidecar "
        "exports at most MODELKV_SIDECAR_MAX_DISCOVERED_OWNERS of those per engine.",
    )
    census_max_modules: int = setting(
        100_000, positive_int, "Modules one census visits at most; a census that stops there says so."
    )
    census_max_objects: int = setting(
        500_000,
        positive_int,
        "Objects (tensors, containers, plain objects) one census visits at most; a census that stops there says so.",
    )
    census_max_depth: int = setting(
        8,
        positive_int,
        "How deep the census follows a module's attributes through containers and plain objects; what lies "
        "deeper is not looked at, and the census says so.",
    )


@dataclass(frozen=True)
class HookConfig:
    """The engine-side settings: every field but the spool directory is a setting."""

    spool_dir: Path
    sample_interval: float = setting(
        5.0, interval_seconds, "Seconds between the engine's memory samples and heartbeats (at least 1)."
    )
    engine_id: str | None = setting(
        None,
        str,
        "Prefix of the engine ids the plugin publishes under (default: the served model name, else the "
        "model directory's name); set it when two engines in one pod serve the same model name.",
    )
    observe: bool = setting(
        True,
        switch,
        "Observe what the transformers caches of each declaring owner really hold (1 or 0); "
        "0 installs no hook at all, and every observed figure is then absent.",
    )
    discover: bool = setting(
        True,
        switch,
        "Discover modules that hold caches they do not declare (1 or 0): transformers caches built while no "
        "declaring owner runs, and tensors modules hold that they did not hold after load. MODELKV_OBSERVE=0 "
        "turns discovery off too.",
    )
    discovery: DiscoverySettings = group(DiscoverySettings)
    """How discovery runs (``engine.discover``): its settings, read from here alone."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> HookConfig | None:
        """None when ``MODELKV_SPOOL_DIR`` is unset (the plugin then stays inactive)."""
        values = read_environ(environ)
        if not values["spool_dir"]:
            return None
        return build(cls, values, spool_dir=Path(values["spool_dir"]))


TABLE = Table(
    "engine", (HookConfig,), notes={"spool_dir": "Setting it in the engine's environment turns the vLLM plugin on."}
)


def read_environ(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every engine setting by name, from ``environ`` (the process's by default); each malformed one is logged."""
    environ = os.environ if environ is None else environ
    values, problems = TABLE.from_environ(environ)
    for problem in problems.values():
        logger.warning("modelkv: %s; using the default", problem)
    return values


def observation_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``MODELKV_OBSERVE`` (on unless turned off), for a caller that has no ``HookConfig``: the hook passes
    ``HookConfig.observe`` instead."""
    return bool(read_environ(environ)["observe"])
