"""The PromQL this project ships: the rule file's expressions and the dashboards' queries."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from modelkv_exporter.sidecar.catalogue import CATALOGUE
from modelkv_testbed import ROOT

RULES_FILE = ROOT / "deploy" / "prometheus" / "modelkv-rules.yaml"
RULE_TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.test.yaml"))
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
PROMETHEUS_METRICS = {"up", "scrape_duration_seconds"}
FLEET_GROUPS = ("modelkv.fleet",)
"""The groups that need every pod's series where Prometheus is sharded by node; a shard loads every other group."""
FLEET_FEDERATION_MATCH = ('{__name__="modelkv_engine_declarations"}', 'up{job="modelkv-exporter"}')
"""The match[] selectors the fleet's Prometheus federates from every shard: what ``FLEET_GROUPS`` read (docs/deploy.md)."""
FEDERATION_MATCH = ('{__name__=~"modelkv_.+"}', '{__name__=~"up|scrape_duration_seconds", job="modelkv-exporter"}')
"""The match[] selectors a Prometheus federates for the dashboards (docs/deploy.md)."""
_VARIABLES = {
    "$job": "modelkv-exporter",
    "$namespace": ".*",
    "$pod": ".*",
    "$model": ".*",
    "$stage": ".*",
    "$engine": ".*",
    "$device": ".*",
    "$__rate_interval": "15s",
    "$__interval": "15s",
}


@dataclass(frozen=True)
class Expression:
    """One PromQL expression and where it comes from."""

    origin: str
    expr: str


def rule_groups(path: Path = RULES_FILE) -> list[dict[str, Any]]:
    """The ``groups`` of a rule file."""
    groups: list[dict[str, Any]] = yaml.safe_load(path.read_text())["groups"]
    return groups


def rules() -> list[dict[str, Any]]:
    """Every rule of the rule file, recording and alerting."""
    return [rule for group in rule_groups() for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    """The alerting rules."""
    return [rule for rule in rules() if "alert" in rule]


def recorded_names() -> set[str]:
    """Names the recording rules create."""
    return {rule["record"] for rule in rules() if "record" in rule}


def rule_expressions() -> list[Expression]:
    """Every rule's expression, labelled by the rule's name."""
    return [Expression(rule.get("record") or rule["alert"], rule["expr"]) for rule in rules()]


def dashboard_documents() -> dict[str, dict[str, Any]]:
    """Each committed dashboard by file name."""
    return {path.name: json.loads(path.read_text()) for path in DASHBOARDS}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel of a dashboard, rows included, nested rows flattened."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def dashboard_expressions() -> list[Expression]:
    """Every panel target's expression, labelled by dashboard, panel and refId."""
    return [
        Expression(f"{name}: {panel['title']} [{target['refId']}]", target["expr"])
        for name, dashboard in dashboard_documents().items()
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def variable_queries() -> list[Expression]:
    """Each query variable's ``label_values(selector, label)``."""
    return [
        Expression(f"{name}: ${variable['name']}", variable["query"])
        for name, dashboard in dashboard_documents().items()
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]


def substitute(expr: str) -> str:
    """``expr`` with the dashboards' template variables replaced as 'All' would."""
    for variable, value in sorted(_VARIABLES.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(variable, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers before a selector or range, not functions or labels."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_groupings = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", without_strings)
    candidates = set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_:]*", without_groupings))
    return {name for name in candidates if name.startswith("modelkv_") or name in PROMETHEUS_METRICS}


def known_metric(name: str) -> bool:
    """A metric the exporter emits, a recording rule's output, or one of Prometheus's."""
    return name in CATALOGUE or name in recorded_names() or name in PROMETHEUS_METRICS
