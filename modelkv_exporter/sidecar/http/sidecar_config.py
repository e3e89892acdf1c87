"""The sidecar's configuration: one typed object, every field but the spool directory a setting.

``serve`` and the demo build it from their flags and ``MODELKV_`` variables (``contract.settings.build``);
a test builds it in code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelkv_exporter.contract.setting_values import port_number, web_address
from modelkv_exporter.contract.settings import group, setting
from modelkv_exporter.sidecar.attention import CLI
from modelkv_exporter.sidecar.budget import Budget
from modelkv_exporter.sidecar.http.limits import HttpLimits
from modelkv_exporter.sidecar.http.spool_watch import DEFAULT_CHECK_INTERVAL_SECONDS
from modelkv_exporter.sidecar.reader.scan import SpoolLimits
from modelkv_exporter.sidecar.reader.state import Staleness

PROBE_PORT = 9401
"""The liveness port ``serve`` listens on unless told otherwise; the Kubernetes manifests probe it."""


@dataclass(frozen=True)
class SidecarConfig:
    """What the sidecar app and its server need to know."""

    spool_dir: Path
    staleness: Staleness = group(Staleness)
    reading: SpoolLimits = group(SpoolLimits)
    budget: Budget = group(Budget)
    http: HttpLimits = group(HttpLimits, "http_")
    probe_port: int = setting(
        0,
        port_number,
        "TCP port of the liveness listener: GET /healthz answered from its own thread, 200 while the server's "
        "event loop turns (0 turns it off; /healthz on --port answers too).",
    )
    """0 for none, in code; ``serve`` listens on ``PROBE_PORT``."""

    runbook_url: str = setting(
        "",
        web_address,
        "Address of docs/runbook.md where you publish it (the chart's prometheusRule.runbookUrl): the landing page "
        "links each problem's runbook section there; unset, it names the section in docs/runbook.md.",
    )
    cli: str = CLI
    """The command the landing page tells people to run (the demo names its own console script)."""
    cli_spool: str = ""
    """The spool as those commands name it: none (the page shows no paths; in the sidecar's container the command
    reads MODELKV_SPOOL_DIR), or the demo's own directory, which its terminal prints too."""

    spool_check_interval: float = DEFAULT_CHECK_INTERVAL_SECONDS
    """Seconds between checks that the spool directory exists and can be listed (a warning while not)."""
