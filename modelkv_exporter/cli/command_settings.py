"""What each command reads: one settings table per command, each setting a flag and a ``MODELKV_`` variable.

A command's table lists the typed objects it builds (the sidecar's ``SidecarConfig``, the spool
reader's ``SpoolLimits``, the objects below) and the defaults it alone changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelkv_exporter.contract.setting_values import byte_size, log_level, non_negative_float, port_number, positive_int
from modelkv_exporter.contract.settings import REQUIRED, Table, setting
from modelkv_exporter.sidecar.http.sidecar_config import PROBE_PORT, SidecarConfig
from modelkv_exporter.sidecar.reader.scan import SpoolLimits
from modelkv_exporter.sidecar.reader.state import Staleness


@dataclass(frozen=True)
class ServerSettings:
    """Where a command that serves HTTP listens, and what it logs."""

    host: str = setting("0.0.0.0", str, "Address the HTTP server binds.")
    port: int = setting(9400, port_number, "TCP port of the HTTP server.")
    log_level: str = setting("info", log_level, "Log level: critical, error, warning, info or debug.")


@dataclass(frozen=True)
class DemoSettings:
    """How the demo's engines beat, and how long the demo runs."""

    heartbeat_interval: float = setting(5.0, non_negative_float, "Seconds between the demo engines' heartbeats.")
    duration: float = setting(
        0.0, non_negative_float, "Stop the demo after this many seconds (0 runs until interrupted)."
    )


@dataclass(frozen=True)
class PlanSettings:
    """What ``plan`` plans for: a max_num_seqs, a cache memory, or both (it needs one)."""

    max_num_seqs: int | None = setting(
        None, positive_int, "The max_num_seqs to plan for: plan prints each engine's peak at it."
    )
    cache_memory: int | None = setting(
        None,
        byte_size,
        "Bytes each engine's model-local caches may take at their peak (1073741824, 512MiB, 2GiB; 2GB is "
        "2000000000); plan prints the largest max_num_seqs whose peak fits in it.",
    )


DIR_ARGUMENT = (
    "The DIR argument gives it too: DIR and --spool-dir naming different directories is an error, and DIR wins "
    "over MODELKV_SPOOL_DIR (with a note)."
)

TABLES: dict[str, Table] = {
    table.program: table
    for table in (
        Table("serve", (ServerSettings, SidecarConfig), defaults={"spool_dir": REQUIRED, "probe_port": PROBE_PORT}),
        Table(
            "demo",
            (ServerSettings, SidecarConfig, DemoSettings),
            defaults={"host": "127.0.0.1"},
            notes={
                "spool_dir": "modelkv-demo-PORT in the system's temporary directory when unset, kept when the demo ends."
            },
        ),
        Table("inspect", (Staleness, SpoolLimits), notes={"spool_dir": DIR_ARGUMENT}),
        Table("plan", (Staleness, SpoolLimits, PlanSettings), notes={"spool_dir": DIR_ARGUMENT}),
        Table("check", (SpoolLimits,), notes={"spool_dir": DIR_ARGUMENT}),
    )
}
"""Every command's table, by command name, in the order the commands are listed."""
