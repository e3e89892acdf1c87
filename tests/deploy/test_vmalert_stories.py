"""The rule file on VictoriaMetrics: vmalert replays every story over a real victoria-metrics (Debian's package).

Each episode's series go to one victoria-metrics by remote write (staleness markers included), each
episode days apart from the others; one ``vmalert -replay`` per episode evaluates the rule file over
it, writing recorded series and ``ALERTS`` back. The stories' checks are then judged on what vmalert
wrote: its expressions (MetricsQL), with Prometheus's alert states (``for``, ``keep_firing_for``) run
over the alerts they make active, must pass every check promtool passes; vmalert's own alert states
miss only the checks that need ``keep_firing_for``, which Debian's vmalert (1.79) rejects
(docs/deploy.md). Annotations are not compared: replay writes no annotations.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.deploy.simulation.replay import Timeline, episode_series, judge
from tests.deploy.simulation.stories import STORIES
from tests.deploy.simulation.story import AlertTest, Episode, Firing, Held, Story
from tests.support.promql import RULES_FILE, alerts
from tests.support.victoria import (
    STALE,
    export,
    flush,
    query,
    remote_write,
    replay,
    running_victoria_metrics,
    victoria_tool,
)

SPACING = 3 * 86400
"""Seconds between two episodes' starts: more than the rules' longest window (a day) plus an episode."""
REPLAY_TIMEOUT = 300
MISSED_WITHOUT_KEEP_FIRING_FOR = {
    ("story-h-scrape-gap", 0, "Held", "ModelKVUndeclaredMemoryGrowth"),
}
"""Checks vmalert's own alert states miss (story, episode, check, alert): each needs ``keep_firing_for``. Without
it, the leak's page resolves during the sidecar's seven-minute scrape gap and fires again 15 minutes after."""


def vmalert_rules(text: str) -> str:
    """The rule file as Debian's vmalert loads it: without ``keep_firing_for``, which it does not know."""
    return re.sub(r"^ *keep_firing_for: .*\n", "", text, flags=re.M)


SELF_READ = "(modelkv_engine:stale:info unless on (job, instance, engine) modelkv_engine_up)"
REPLAYED_SELF_READ = (
    "(last_over_time((modelkv_engine:device_key:info and on (job, instance, engine) (modelkv_engine_up == 0))[1d:1m])"
    " unless on (job, instance, engine) modelkv_engine_up)"
)
"""``modelkv_engine:stale:info`` reads its own previous result, which replay (one rule over the whole range, then the
next) cannot: replayed, it reads the engines stale at some minute of the last day instead, which is the same in
every story (the tests below say so: every check passes with it)."""


def replay_rules(text: str) -> str:
    """The rule file as vmalert replays it: no annotations (replay runs no ``query`` in a template), no self-read."""
    document = yaml.safe_load(vmalert_rules(text))
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
class Replayed:
    """One episode as vmalert replayed it: where it starts, and the alerts vmalert wrote."""

    story: Story
    index: int
    episode: Episode
    base: int
    timeline: Timeline


@dataclass
class Victoria:
    """The replayed episodes and the victoria-metrics holding them."""

    url: str
    episodes: list[Replayed]


def _flushing(url: str, stop: threading.Event) -> None:
    """Make each rule's results searchable before vmalert's next rule reads them."""
    while not stop.wait(0.1):
        flush(url)


def _timeline(url: str, base: int, minutes: int) -> Timeline:
    timeline = Timeline()
    for labels, points in export(url, "ALERTS", base, base + minutes * 60).items():
        for at, value in points:
            if value == value:
                timeline.add(dict(labels), (at // 1000 - base) // 60)
    return timeline


@pytest.fixture(scope="module")
def victoria(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Victoria]:
    tmp = tmp_path_factory.mktemp("victoria")
    rules = tmp / "modelkv-rules.yaml"
    rules.write_text(replay_rules(RULES_FILE.read_text()))
    episodes = [(story, i, episode) for story in STORIES for i, episode in enumerate(story.episodes)]
    first = (int(time.time()) // 86400 - 1) * 86400 - len(episodes) * SPACING
    bases = [first + k * SPACING for k in range(len(episodes))]
    with running_victoria_metrics(tmp) as url:
        for base, (_, _, episode) in zip(bases, episodes, strict=True):
            remote_write(url, episode_series(episode, base, STALE))
        flush(url)
        stop = threading.Event()
        flusher = threading.Thread(target=_flushing, args=(url, stop), daemon=True)
        flusher.start()
        try:
            runs = [
                replay(rules, url, base, base + e.minutes * 60) for base, (_, _, e) in zip(bases, episodes, strict=True)
            ]
            for run in runs:
                output, _ = run.communicate(timeout=REPLAY_TIMEOUT)
                assert run.returncode == 0, output.decode()[-3000:]
        finally:
            stop.set()
            flusher.join()
        flush(url)
        yield Victoria(
            url,
            [
                Replayed(story, i, episode, base, _timeline(url, base, episode.minutes))
                for base, (story, i, episode) in zip(bases, episodes, strict=True)
            ],
        )


def _failures(victoria: Victoria, as_prometheus: bool) -> dict[tuple[str, int, str, str], str]:
    failed: dict[tuple[str, int, str, str], str] = {}
    for run in victoria.episodes:

        def answer(expr: str, minute: int, base: int = run.base) -> dict[tuple[tuple[str, str], ...], float]:
            found = query(victoria.url, expr, base + minute * 60)
            return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in found}

        timeline = run.timeline.as_prometheus(holds(), run.episode.minutes) if as_prometheus else run.timeline
        for check in run.episode.checks:
            wrong = judge(check, timeline, answer)
            if wrong is not None:
                name = getattr(check, "alert", getattr(check, "expr", ""))
                failed[(run.story.name, run.index, type(check).__name__, name)] = wrong
    return failed


def test_vmalert_loads_the_rule_file_without_keep_firing_for(tmp_path: Path) -> None:
    """Its expressions and annotation templates (``query``, ``sortByLabel`` included) as a live vmalert checks them."""
    groups = yaml.safe_load(vmalert_rules(RULES_FILE.read_text()))["groups"]
    assert not [r for g in groups for r in g["rules"] if "keep_firing_for" in r]
    rules = tmp_path / "modelkv-rules.yaml"
    rules.write_text(vmalert_rules(RULES_FILE.read_text()))
    checked = subprocess.run(
        [victoria_tool("vmalert"), "-dryRun", f"-rule={rules}", "-rule.validateTemplates", "-rule.validateExpressions"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert set(holds()) == {a["alert"] for a in alerts()}


def test_the_judge_fails_an_alert_that_never_fires() -> None:
    """Judged on an empty timeline, every check that expects an alert fails: the judge is not vacuous."""
    expecting = [
        check
        for story in STORIES
        for episode in story.episodes
        for check in episode.checks
        if isinstance(check, Firing | Held | AlertTest) and check.alerts
    ]
    assert len(expecting) >= 10
    for check in expecting:
        assert judge(check, Timeline(), lambda expr, minute: {}) is not None, check


def test_every_story_holds_on_vmalerts_expressions(victoria: Victoria) -> None:
    """MetricsQL agrees with PromQL: Prometheus's alert states over what vmalert's expressions make active."""
    assert len(victoria.episodes) == sum(len(s.episodes) for s in STORIES)
    assert _failures(victoria, as_prometheus=True) == {}


def test_vmalerts_own_alert_states_miss_only_what_needs_keep_firing_for(victoria: Victoria) -> None:
    assert set(_failures(victoria, as_prometheus=False)) == MISSED_WITHOUT_KEEP_FIRING_FOR
