"""The stories on VictoriaMetrics: the rule file as vmalert replays it, episodes side by side, alerts judged.

Every episode starts ``SPACING`` after the one before, so that one victoria-metrics holds them all
and no rule's window reaches from one into another; one ``vmalert -replay`` per episode (and per
victoria-metrics) evaluates the rules over it, all side by side.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

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


SIDE_BY_SIDE_RULES_DELAY = "1500ms"
"""vmalert's pause between two rules of a group when every episode replays at once: with a hundred replays on two
cores, 500 ms (one replay's) let a rule read before the flush made the previous rule's results searchable, and
several stories lost their alerts on a busy machine; 1.5 s held on the same machine (the run takes about 1.8 times
as long)."""


def replay_side_by_side(runs: Sequence[tuple[Path, str, Placed]]) -> None:
    """Replay each (rules, victoria-metrics, episode) at once, flushing every victoria-metrics ten times a second and
    pausing ``SIDE_BY_SIDE_RULES_DELAY`` between rules, so that a rule's results are searchable before the next rule
    reads them."""
    urls = sorted({url for _, url, _ in runs})
    for url in urls:
        flush(url)
    stop = threading.Event()

    def flushing() -> None:
        while not stop.wait(0.1):
            for url in urls:
                flush(url)

    flusher = threading.Thread(target=flushing, daemon=True)
    flusher.start()
    try:
        processes = [replay(rules, url, p.base, p.end, rules_delay=SIDE_BY_SIDE_RULES_DELAY) for rules, url, p in runs]
        for process in processes:
            output, _ = process.communicate(timeout=REPLAY_TIMEOUT)
            assert process.returncode == 0, output.decode()[-3000:]
    finally:
        stop.set()
        flusher.join()
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
