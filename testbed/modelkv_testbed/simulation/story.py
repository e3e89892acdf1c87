"""A story: engines and devices over some hours, what an operator expects, and its promtool test file."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

import yaml

from modelkv_testbed.simulation.physics import Device, Engine, simulate
from modelkv_testbed.simulation.render import JOB, NAMESPACE, ScrapeGap, selector, series, values_text


def engine_labels(engine: Engine, **extra: str) -> dict[str, str]:
    """The labels of an engine's alert (``severity`` and any others given); a label without a value is none (a
    dense model's engine has no stage)."""
    labels = {"job": JOB, "instance": engine.instance, "namespace": NAMESPACE, "pod": engine.pod}
    labels = {**labels, "engine": engine.engine_id, "model": engine.model, "stage": engine.stage, **extra}
    return {name: value for name, value in labels.items() if value}


def device_labels(device: Device, **extra: str) -> dict[str, str]:
    """The labels of a device's alert."""
    return {"device": device.uuid, "device_key": device.uuid, **extra}


@dataclass(frozen=True)
class Firing:
    """At ``minute``, exactly these alerts of ``alert`` are firing (label sets without alertname)."""

    alert: str
    minute: int
    alerts: tuple[dict[str, str], ...] = ()

    def test(self) -> dict[str, Any]:
        # The range ends half a minute after ``since``: one sample per evaluation after it, whether the
        # range includes its start (Prometheus 2) or not (Prometheus 3).
        samples = [
            {"labels": selector("ALERTS", _sorted({"alertname": self.alert, "alertstate": "firing", **a})), "value": 1}
            for a in self.alerts
        ]
        return {
            "expr": f'ALERTS{{alertname="{self.alert}", alertstate="firing"}}',
            "eval_time": f"{self.minute}m",
            "exp_samples": samples,
        }


@dataclass(frozen=True)
class Quiet:
    """From minute ``since`` to minute ``until``, ``alert`` never fires (for the engines or devices matched)."""

    alert: str
    since: int
    until: int
    matching: str = ""

    def test(self) -> dict[str, Any]:
        matchers = f'alertname="{self.alert}", alertstate="firing"' + (f", {self.matching}" if self.matching else "")
        return {
            "expr": f"max_over_time(ALERTS{{{matchers}}}[{self.until - self.since}m])",
            "eval_time": f"{self.until}m",
            "exp_samples": [],
        }


@dataclass(frozen=True)
class Held:
    """From minute ``since`` to minute ``until``, these alerts of ``alert`` fire at every evaluation, and no other.

    One alert that fires throughout, never resolved and fired again: an alert that resolves for one
    evaluation misses a sample, and one that fires anew is a second alert in the count.
    """

    alert: str
    since: int
    until: int
    alerts: tuple[dict[str, str], ...]
    matching: str = ""

    def test(self) -> dict[str, Any]:
        matchers = f'alertname="{self.alert}", alertstate="firing"' + (f", {self.matching}" if self.matching else "")
        # The range ends half a minute after ``since``: one sample per evaluation after it, whether the
        # range includes its start (Prometheus 2) or not (Prometheus 3).
        samples = [
            {"labels": selector("", _sorted({"alertname": self.alert, "alertstate": "firing", **a})), "value": span}
            for a in self.alerts
            for span in (self.until - self.since,)
        ]
        return {
            "expr": f"count_over_time(ALERTS{{{matchers}}}[{(self.until - self.since) * 60 - 30}s])",
            "eval_time": f"{self.until}m",
            "exp_samples": samples,
        }


@dataclass(frozen=True)
class Value:
    """At ``minute``, ``expr`` has exactly these samples (label sets with their values)."""

    expr: str
    minute: int
    samples: tuple[tuple[str, float], ...]

    def test(self) -> dict[str, Any]:
        return {
            "expr": self.expr,
            "eval_time": f"{self.minute}m",
            "exp_samples": [{"labels": labels, "value": value} for labels, value in self.samples],
        }


@dataclass(frozen=True)
class AlertTest:
    """promtool's own alert check, annotations included (``alerts``: labels and annotations of each)."""

    alert: str
    minute: int
    alerts: tuple[tuple[dict[str, str], dict[str, str]], ...] = ()

    def test(self) -> dict[str, Any]:
        return {
            "alertname": self.alert,
            "eval_time": f"{self.minute}m",
            "exp_alerts": [{"exp_labels": labels, "exp_annotations": notes} for labels, notes in self.alerts],
        }


Expectation = Firing | Held | Quiet | Value | AlertTest


@dataclass(frozen=True)
class Episode:
    """One promtool test group: engines for ``minutes``, what the operator expects, and the checks that say it."""

    expects: str
    engines: list[Engine]
    minutes: int
    checks: list[Expectation] = field(default_factory=list)
    gaps: tuple[ScrapeGap, ...] = ()
    """Minutes in which Prometheus cannot scrape a sidecar."""


@dataclass(frozen=True)
class Story:
    """One situation: its file name, what happens, and its episodes."""

    name: str
    situation: str
    episodes: list[Episode]

    def text(self) -> str:
        """The promtool test file."""
        header = [
            "# Generated by testbed/modelkv_testbed/simulation (python -m modelkv_testbed.simulation.generate); do not edit.",
            "#",
            *("# " + line if line else "#" for line in _wrap(self.situation)),
            "rule_files:",
            "  - ../modelkv-rules.yaml",
            "evaluation_interval: 1m",
            "tests:",
        ]
        parts = ["\n".join(header) + "\n"]
        for episode in self.episodes:
            parts.append("".join(f"  # {line}\n" if line else "  #\n" for line in _wrap(episode.expects, 96)))
            parts.append(_indent(yaml.safe_dump([_group(episode)], sort_keys=False, width=1000), "  "))
        return "".join(parts)


def _sorted(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _wrap(text: str, width: int = 98) -> list[str]:
    lines: list[str] = []
    for paragraph in textwrap.dedent(text).strip().split("\n\n"):
        lines.extend(textwrap.wrap(" ".join(paragraph.split()), width))
        lines.append("")
    return lines[:-1]


def _indent(text: str, prefix: str) -> str:
    return "".join(prefix + line if line.strip() else line for line in text.splitlines(keepends=True))


def _group(episode: Episode) -> dict[str, Any]:
    timeline = simulate(episode.engines, episode.minutes)
    found = series(episode.engines, timeline, episode.minutes, episode.gaps)
    group: dict[str, Any] = {
        "interval": "1m",
        "input_series": [
            {"series": selector(name, labels), "values": values_text(values)}
            for (name, labels), values in sorted(found.items())
        ],
    }
    promql = [c.test() for c in episode.checks if not isinstance(c, AlertTest)]
    alerts = [c.test() for c in episode.checks if isinstance(c, AlertTest)]
    if promql:
        group["promql_expr_test"] = promql
    if alerts:
        group["alert_rule_test"] = alerts
    return group
