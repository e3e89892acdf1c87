"""The stories on VictoriaMetrics: the rule file as vmalert replays it, episodes side by side, alerts judged.

Every episode starts ``SPACING`` after the one before, so that one victoria-metrics holds them all
and no rule's window reaches from one into another; one ``vmalert -replay`` per episode (and per
victoria-metrics) evaluates the rules over it, all side by side, stage by stage (``stages``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from modelkv_testbed.promql import alerts
from modelkv_testbed.simulation.replay import Labels, Timeline, judge
from modelkv_testbed.simulation.stories import STORIES
from modelkv_testbed.simulation.story import Episode, Story
from modelkv_testbed.victoria import export, flush, replay

SPACING = 3 * 86400
"""Seconds between two episodes' starts: more than the rules' longest window (a day) plus an episode."""
REPLAY_TIMEOUT = 300
SELF_READ = "(modelkv_engine:stale:info unless on (job, instance, engine) modelkv_engine_up)"
REPLAYED_SELF_READ = (
    "(last_over_time((modelkv_engine:device_key:info and on (job, instance, engine) (modelkv_engine_up == 0))[1d:1m])"
    " unless on (job, instance, engine) modelkv_engine_up)"
)
"""``modelkv_engine:stale:info`` reads its own previous result, which replay (one rule over the whole range, then the
next) cannot: replayed, it reads the engines stale at some minute of the last day instead, which is the same in
every story (the tests say so: every check passes with it)."""


def vmalert_rules(text: str) -> str:
    """The rule file as Debian's vmalert loads it: without ``keep_firing_for``, which it does not know."""
    return re.sub(r"^ *keep_firing_for: .*\n", "", text, flags=re.M)


def replay_rules(text: str, groups: Callable[[str], bool] = lambda name: True) -> str:
    """The ``groups`` of the rule file as vmalert replays them: no annotations (replay runs no ``query`` in a
    template), and no rule reading its own result."""
    document = yaml.safe_load(vmalert_rules(text))
    document["groups"] = [g for g in document["groups"] if groups(g["name"])]
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
            if rule.get("record") == "modelkv_engine:stale:info":
                assert SELF_READ in rule["expr"]
                rule["expr"] = rule["expr"].replace(SELF_READ, REPLAYED_SELF_READ)
    return yaml.safe_dump(document, sort_keys=False)


def _minutes(duration: str | None) -> int:
    if not duration:
        return 0
    found = re.fullmatch(r"(\d+)([mh])", duration)
    assert found, duration
    return int(found[1]) * (60 if found[2] == "h" else 1)


def holds() -> dict[str, tuple[int, int]]:
    """Each alert's ``for`` and ``keep_firing_for`` in minutes (one pair per name)."""
    found: dict[str, tuple[int, int]] = {}
    for rule in alerts():
        pair = (_minutes(rule.get("for")), _minutes(rule.get("keep_firing_for")))
        assert found.setdefault(rule["alert"], pair) == pair, rule["alert"]
    return found


@dataclass
class Placed:
    """One episode of one story, and where it starts (seconds since the epoch)."""

    story: Story
    index: int
    episode: Episode
    base: int

    @property
    def end(self) -> int:
        """Its last minute."""
        return self.base + self.episode.minutes * 60


def placed() -> list[Placed]:
    """Every story's episodes, ``SPACING`` apart, the last ending days before today."""
    episodes = [(story, i, episode) for story in STORIES for i, episode in enumerate(story.episodes)]
    first = (int(time.time()) // 86400 - 1) * 86400 - len(episodes) * SPACING
    return [Placed(s, i, e, first + k * SPACING) for k, (s, i, e) in enumerate(episodes)]


def stages(text: str) -> list[str]:
    """A replayed rule file (``replay_rules``) as the stages replay runs one after another: each rule in the stage
    after the last one holding a rule whose result it reads, its group's settings kept. vmalert replays one rule over
    the whole range, then the next; a stage's replays all end, and their results are flushed, before the next stage
    reads them, so no rule reads another's results before they are searchable, however busy the machine."""
    document = yaml.safe_load(text)
    stage_of: dict[str, int] = {}
    staged: list[list[dict[str, Any]]] = []
    for group in document["groups"]:
        for rule in group["rules"]:
            reads = [
                s for name, s in stage_of.items() if re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", rule["expr"])
            ]
            stage = max(reads, default=-1) + 1
            name = rule.get("record")
            if name is not None:
                stage_of[name] = max(stage_of.get(name, 0), stage)
            while len(staged) <= stage:
                staged.append([])
            groups = staged[stage]
            if not groups or groups[-1]["name"] != group["name"]:
                groups.append({**group, "rules": []})
            groups[-1]["rules"].append(rule)
    return [yaml.safe_dump({**document, "groups": groups}, sort_keys=False) for groups in staged]


def replay_side_by_side(runs: Sequence[tuple[Path, str, Placed]]) -> None:
    """Replay each (rules, victoria-metrics, episode) at once, stage by stage (``stages``): every replay of a stage
    ends, and every victoria-metrics is flushed, before the next stage starts."""
    urls = sorted({url for _, url, _ in runs})
    staged: dict[Path, list[Path]] = {}
    for rules in {rules for rules, _, _ in runs}:
        staged[rules] = []
        for k, text in enumerate(stages(rules.read_text())):
            staged[rules].append(rules.with_name(f"{rules.stem}.stage-{k}{rules.suffix}"))
            staged[rules][-1].write_text(text)
    for url in urls:
        flush(url)
    for stage in range(max(len(files) for files in staged.values())):
        processes = [
            replay(staged[rules][stage], url, p.base, p.end) for rules, url, p in runs if stage < len(staged[rules])
        ]
        for process in processes:
            output, _ = process.communicate(timeout=REPLAY_TIMEOUT)
            assert process.returncode == 0, output.decode()[-3000:]
        for url in urls:
            flush(url)


def timeline(urls: Sequence[str], episode: Placed) -> Timeline:
    """The ``ALERTS`` the replays wrote into ``urls`` over ``episode``, minute by minute."""
    found = Timeline()
    for url in urls:
        for labels, points in export(url, "ALERTS", episode.base, episode.end).items():
            for at, value in points:
                if value == value:
                    found.add(dict(labels), (at // 1000 - episode.base) // 60)
    return found


Failures = dict[tuple[str, int, str, str], str]


def failures(
    episodes: Sequence[tuple[Placed, Timeline]],
    answer: Callable[[Placed, str, int], dict[Labels, float]],
    as_prometheus: bool,
) -> Failures:
    """Each check the timelines fail (story, episode, check, alert or expression) and why.

    ``as_prometheus``: judge Prometheus's alert states run over the alerts vmalert made active, not vmalert's own.
    """
    failed: Failures = {}
    for episode, found in episodes:
        states = found.as_prometheus(holds(), episode.episode.minutes) if as_prometheus else found
        for check in episode.episode.checks:

            def ask(expr: str, minute: int, placed: Placed = episode) -> dict[Labels, float]:
                return answer(placed, expr, minute)

            wrong = judge(check, states, ask)
            if wrong is not None:
                name = getattr(check, "alert", getattr(check, "expr", ""))
                failed[(episode.story.name, episode.index, type(check).__name__, name)] = wrong
    return failed
