"""The stories replayed outside promtool: their series at a real time, alert timelines, and their checks judged on them.

A story's episode starts at minute 0 of the epoch in promtool; elsewhere it starts at ``base``
(seconds), and the one series whose value is a time (``modelkv_engine_start_time_seconds``) moves
with it. An alert timeline says, minute by minute, which label sets of each alert are pending and
which firing; ``judge`` holds a story's checks to one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from modelkv_testbed.simulation.physics import simulate
from modelkv_testbed.simulation.render import series
from modelkv_testbed.simulation.story import AlertTest, Episode, Expectation, Firing, Held, Quiet, Value

Labels = tuple[tuple[str, str], ...]
Point = tuple[int, float]
TIMES = {"modelkv_engine_start_time_seconds"}
"""Families whose value is a Unix time: shifted with the episode."""
_MATCHER = re.compile(r'(\w+)(=~|!~|!=|=)"((?:[^"\\]|\\.)*)"')


def episode_series(episode: Episode, base: int, stale: float) -> dict[Labels, list[Point]]:
    """Every series of ``episode`` as remote write sends it: ``__name__`` among the labels, millisecond times.

    A series that disappears gets ``stale`` (the staleness marker) at its first missing minute.
    """
    timeline = simulate(episode.engines, episode.minutes)
    found = series(episode.engines, timeline, episode.minutes, episode.gaps)
    out: dict[Labels, list[Point]] = {}
    for (name, labels), values in found.items():
        points: list[Point] = []
        seen = False
        for minute, value in enumerate(values):
            at = (base + minute * 60) * 1000
            if value is None:
                if seen:
                    points.append((at, stale))
                seen = False
                continue
            seen = True
            points.append((at, value + base if name in TIMES else value))
        out[(("__name__", name), *labels)] = points
    return out


@dataclass
class Timeline:
    """Per alert name, per label set (without ``alertname`` and ``alertstate``): minute -> ``pending`` or ``firing``."""

    alerts: dict[str, dict[Labels, dict[int, str]]] = field(default_factory=dict)

    def add(self, labels: dict[str, str], minute: int) -> None:
        """Record one ``ALERTS`` sample."""
        rest = tuple(
            sorted((k, v) for k, v in labels.items() if k not in ("__name__", "alertname", "alertstate", "alertgroup"))
        )
        self.alerts.setdefault(labels["alertname"], {}).setdefault(rest, {})[minute] = labels["alertstate"]

    def firing(self, alert: str, minute: int) -> set[Labels]:
        """The label sets of ``alert`` firing at ``minute``."""
        return {k for k, states in self.alerts.get(alert, {}).items() if states.get(minute) == "firing"}

    def as_prometheus(self, holds: dict[str, tuple[int, int]], minutes: int) -> Timeline:
        """This timeline's active alerts (pending or firing) run through Prometheus's alert states.

        ``holds`` gives each alert's ``for`` and ``keep_firing_for`` in minutes: an alert fires once it
        has been active ``for`` minutes, and keeps firing ``keep_firing_for`` minutes after it stops.
        """
        out = Timeline()
        for alert, by_labels in self.alerts.items():
            hold, keep = holds[alert]
            for labels, states in by_labels.items():
                active_since: int | None = None
                missing_since: int | None = None
                fired = False
                for minute in range(minutes + 1):
                    if minute in states:
                        missing_since = None
                        active_since = minute if active_since is None else active_since
                        fired = fired or minute - active_since >= hold
                    elif fired and keep:
                        missing_since = minute if missing_since is None else missing_since
                        if minute - missing_since >= keep:
                            fired, active_since = False, None
                    else:
                        fired, active_since = False, None
                    if active_since is not None or fired:
                        out.alerts.setdefault(alert, {}).setdefault(labels, {})[minute] = (
                            "firing" if fired else "pending"
                        )
        return out


def _matches(labels: Labels, matching: str) -> bool:
    found = dict(labels)
    for name, op, value in _MATCHER.findall(matching):
        have = found.get(name, "")
        hit = re.fullmatch(value, have) is not None if "~" in op else have == value
        if hit == op.startswith("!"):
            return False
    return True


def parse_selector(text: str) -> Labels:
    """``name{k="v",...}`` as sorted labels, ``__name__`` among them where there is a name."""
    name = text.split("{", 1)[0]
    labels = [(k, v.replace('\\"', '"').replace("\\\\", "\\")) for k, _, v in _MATCHER.findall(text)]
    return tuple(sorted([*labels, *((("__name__", name),) if name else ())]))


def judge(check: Expectation, timeline: Timeline, query: Callable[[str, int], dict[Labels, float]]) -> str | None:
    """What ``check`` finds wrong in ``timeline`` (None: it holds). ``query(expr, minute)`` answers a Value."""
    if isinstance(check, Firing | AlertTest):
        expected = (
            {tuple(sorted(a.items())) for a in check.alerts}
            if isinstance(check, Firing)
            else {tuple(sorted(labels.items())) for labels, _ in check.alerts}
        )
        found = timeline.firing(check.alert, check.minute)
        return None if found == expected else f"at {check.minute}m firing {sorted(found)}, expected {sorted(expected)}"
    if isinstance(check, Quiet):
        for minute in range(check.since, check.until + 1):
            loud = {k for k in timeline.firing(check.alert, minute) if _matches(k, check.matching)}
            if loud:
                return f"fires at {minute}m: {sorted(loud)}"
        return None
    if isinstance(check, Held):
        expected = {tuple(sorted(a.items())) for a in check.alerts}
        for minute in range(check.since + 1, check.until + 1):
            found = {k for k in timeline.firing(check.alert, minute) if _matches(k, check.matching)}
            if found != expected:
                return f"at {minute}m firing {sorted(found)}, expected {sorted(expected)}"
        return None
    assert isinstance(check, Value)
    wanted = {parse_selector(labels): value for labels, value in check.samples}
    got = query(check.expr, check.minute)
    return None if got == wanted else f"{check.expr} at {check.minute}m is {got}, expected {wanted}"
