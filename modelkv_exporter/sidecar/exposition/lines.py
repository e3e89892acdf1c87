"""Exposition lines, byte for byte as prometheus_client's encoders write them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from prometheus_client.utils import floatToGoString

from modelkv_exporter.sidecar.catalogue import CATALOGUE, Metric


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str, openmetrics: bool) -> str:
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if openmetrics else text


def sample_line(metric: Metric, values: Sequence[str], value: float) -> str:
    """One exposition line, as prometheus_client writes it in both formats (labels sorted by name)."""
    if metric.labels:
        pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(zip(metric.labels, values, strict=True)))
        return f"{metric.name}{{{pairs}}} {floatToGoString(value)}\n"
    return f"{metric.name} {floatToGoString(value)}\n"


def family_header(metric: Metric, openmetrics: bool) -> str:
    """The HELP and TYPE lines of a family, and in OpenMetrics its UNIT line where it has a unit."""
    if openmetrics:
        name = metric.family_name
        unit = f"# UNIT {name} {metric.unit}\n" if metric.unit else ""
        return f"# HELP {name} {_escape_help(metric.help, True)}\n# TYPE {name} {metric.kind}\n{unit}"
    kind = "gauge" if metric.kind == "info" else metric.kind
    return f"# HELP {metric.name} {_escape_help(metric.help, False)}\n# TYPE {metric.name} {kind}\n"


class LineSink:
    """Collects the ``add``/``info`` calls of the sample functions as exposition lines, by family."""

    def __init__(self) -> None:
        self.lines: defaultdict[str, list[str]] = defaultdict(list)

    def add(self, name: str, values: list[str], value: float) -> None:
        """One sample of family ``name``."""
        self.lines[name].append(sample_line(CATALOGUE[name], values, value))

    def info(self, name: str, values: list[str]) -> None:
        """One info sample (value 1)."""
        self.add(name, values, 1.0)

    def joined(self) -> dict[str, str]:
        """The lines of each family, joined."""
        return {name: "".join(chunk) for name, chunk in self.lines.items()}
