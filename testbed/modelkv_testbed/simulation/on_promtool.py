"""The stories on Prometheus's own rule engine, any share of an episode's series with any of the rule groups.

``promtool test rules`` evaluates a rule file over input series as Prometheus's rule manager does,
alert states (``for``, ``keep_firing_for``) and rules that read their own results included. Here
each of its tests asks, at one minute, for ``ALERTS`` or for an expression and expects nothing:
promtool prints what it got instead, which is read back as an alert timeline and answers. One run
holds many episodes as test groups; each query names its episode in a PromQL comment. The rule
groups are evaluated in the file's order at every minute: left to itself, promtool picks an order
of its own in each run, and a group that reads another's results then reads them a minute older in
one run than in another, which moves an alert by a minute.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelkv_testbed.promql import RULES_FILE
from modelkv_testbed.simulation.render import Series, selector, values_text
from modelkv_testbed.simulation.replay import Labels, Timeline, parse_selector

Question = tuple[str, int]
"""An expression and the minute it is asked at."""
RUNS_AT_ONCE = 2
_FAILURE = re.compile(r'^ {4}expr: (".*"), time: (\S+),\n {8}exp: .*\n {8}got: (.*)$', re.M)
_SAMPLE = re.compile(r'(\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}) ([^\s,]+)')
_DURATION = re.compile(r"(\d+)(w|d|h|m|s)")
_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


@dataclass(frozen=True)
class Part:
    """One episode's input to one Prometheus: its series over ``minutes``, and expressions asked besides ``ALERTS``."""

    key: str
    found: Series
    minutes: int
    questions: tuple[Question, ...] = ()


@dataclass
class Result:
    """What one Prometheus evaluated for one episode: its alerts minute by minute, and each question's answer."""

    alerts: Timeline = field(default_factory=Timeline)
    answers: dict[Question, dict[Labels, float]] = field(default_factory=dict)


def rule_file(groups: Callable[[str], bool] = lambda name: True) -> str:
    """The rule file with only the ``groups`` named."""
    document = yaml.safe_load(RULES_FILE.read_text())
    document["groups"] = [g for g in document["groups"] if groups(g["name"])]
    return yaml.safe_dump(document, sort_keys=False)


def _tagged(expr: str, key: str) -> str:
    return f"{expr}\n# {key}"


def _group(part: Part) -> dict[str, Any]:
    asked = [("ALERTS", minute) for minute in range(part.minutes + 1)] + list(part.questions)
    return {
        "interval": "1m",
        "input_series": [
            {"series": selector(name, labels), "values": values_text(values)}
            for (name, labels), values in sorted(part.found.items())
        ],
        "promql_expr_test": [
            {"expr": _tagged(expr, part.key), "eval_time": f"{minute}m", "exp_samples": []} for expr, minute in asked
        ],
    }


def _minutes(duration: str) -> int:
    seconds = sum(int(n) * _SECONDS[unit] for n, unit in _DURATION.findall(duration))
    assert seconds % 60 == 0 and _DURATION.sub("", duration) == "", duration
    return seconds // 60


def _read(output: str, parts: Sequence[Part]) -> dict[str, Result]:
    results = {part.key: Result() for part in parts}
    failed = _FAILURE.findall(output)
    assert len(failed) == output.count("    expr: "), output[-3000:]
    for quoted, duration, got in failed:
        expr, key = json.loads(quoted).rsplit("\n# ", 1)
        minute = _minutes(duration)
        samples = {parse_selector(labels): float(value) for labels, value in _SAMPLE.findall(got)}
        if expr == "ALERTS":
            for labels in samples:
                results[key].alerts.add(dict(labels), minute)
        else:
            results[key].answers[(expr, minute)] = samples
    for part in parts:
        for question in part.questions:
            results[part.key].answers.setdefault(question, {})
    return results


def _run(promtool: str, rules: str, parts: Sequence[Part], directory: Path) -> dict[str, Result]:
    directory.mkdir(parents=True)
    (directory / "rules.yaml").write_text(rules)
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "group_eval_order": [group["name"] for group in yaml.safe_load(rules)["groups"]],
        "tests": [_group(part) for part in parts if part.found],
    }
    (directory / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False, width=1000))
    done = subprocess.run([promtool, "test", "rules", "test.yaml"], capture_output=True, text=True, cwd=directory)
    said = done.stdout + done.stderr
    assert done.returncode == 0 or "FAILED:" in said, said[-3000:]
    return _read(said, parts)


def evaluate(promtool: str, runs: Sequence[tuple[str, Sequence[Part]]], directory: Path) -> list[dict[str, Result]]:
    """Each (rule file text, episodes' parts) evaluated by one ``promtool test rules``, a few side by side; per run,
    each part's result by its key."""
    with ThreadPoolExecutor(RUNS_AT_ONCE) as pool:
        futures = [
            pool.submit(_run, promtool, rules, parts, directory / f"run-{k}") for k, (rules, parts) in enumerate(runs)
        ]
        return [future.result() for future in futures]
