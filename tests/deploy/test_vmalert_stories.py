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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from modelkv_testbed.processes import require_tool
from modelkv_testbed.promql import RULES_FILE, alerts
from modelkv_testbed.simulation.on_victoria import (
    Placed,
    failures,
    holds,
    placed,
    replay_rules,
    replay_side_by_side,
    stages,
    timeline,
    vmalert_rules,
)
from modelkv_testbed.simulation.replay import Labels, Timeline, episode_series, judge
from modelkv_testbed.simulation.stories import STORIES
from modelkv_testbed.simulation.story import AlertTest, Firing, Held
from modelkv_testbed.victoria import STALE, query, remote_write, running_victoria_metrics

pytestmark = pytest.mark.slow

MISSED_WITHOUT_KEEP_FIRING_FOR = {
    ("story-h-scrape-gap", 0, "Held", "ModelKVUndeclaredMemoryGrowth"),
    ("story-pm-a-engines-that-die", 0, "Held", "ModelKVEngineOutOfMemory"),
}
"""Checks vmalert's own alert states miss (story, episode, check, alert): each needs ``keep_firing_for``. Without
it, the leak's page resolves during the sidecar's seven-minute scrape gap and fires again 15 minutes after; the
out-of-memory page resolves as soon as the restarted engine replaces its snapshot, not an hour after."""
READS_A_STOPPED_RECORD = {
    (
        "story-o-restart-in-place",
        0,
        "Value",
        'max_over_time(modelkv_engine:undeclared_memory_bytes{engine=~"restart-.+"}[40m]) > 0',
    ),
}
"""Checks MetricsQL fails over the replayed rules: a recorded series that stops is still read for its lookback (the
replay writes no staleness marker; Prometheus does). When "restart-cpu" restarts, its old process's
``unplanned_growth_bytes`` (2 GiB) is read for 4 more minutes while the new process loads, against the new process's
``cache_explained_bytes`` (its 1 GiB declaration): 1 GiB of undeclared memory shows for 5 minutes, under the `for`
of ModelKVUndeclaredMemoryGrowth, which stays silent."""


@dataclass
class Victoria:
    """The replayed episodes, the alerts vmalert wrote for each, and the victoria-metrics holding them."""

    url: str
    episodes: list[tuple[Placed, Timeline]]

    def answer(self, episode: Placed, expr: str, minute: int) -> dict[Labels, float]:
        """``expr`` at ``minute`` of ``episode``."""
        found = query(self.url, expr, episode.base + minute * 60)
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in found}


@pytest.fixture(scope="module")
def victoria(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Victoria]:
    tmp = tmp_path_factory.mktemp("victoria")
    rules = tmp / "modelkv-rules.yaml"
    rules.write_text(replay_rules(RULES_FILE.read_text()))
    episodes = placed()
    with running_victoria_metrics(tmp) as url:
        for episode in episodes:
            remote_write(url, episode_series(episode.episode, episode.base, STALE))
        replay_side_by_side([(rules, url, episode) for episode in episodes])
        yield Victoria(url, [(episode, timeline([url], episode)) for episode in episodes])


def test_each_replay_stage_reads_only_what_earlier_stages_wrote() -> None:
    """Replay runs the stages one after another, flushing between them: a rule reading a record its own stage (or a
    later one) writes would read it half written. Every rule is in one stage, in its group."""
    replayed = yaml.safe_load(replay_rules(RULES_FILE.read_text()))
    staged = [yaml.safe_load(text)["groups"] for text in stages(replay_rules(RULES_FILE.read_text()))]
    assert len(staged) > 1
    written: set[str] = set()
    for groups in staged:
        rules = [rule for group in groups for rule in group["rules"]]
        here = {rule["record"] for rule in rules if "record" in rule}
        for rule in rules:
            names = set(re.findall(r"[A-Za-z_:][\w:]*", rule["expr"]))
            assert not names & (here - written), rule
        written |= here
    for group in replayed["groups"]:
        parts = [g["rules"] for groups in staged for g in groups if g["name"] == group["name"]]
        assert sorted(map(str, sum(parts, []))) == sorted(map(str, group["rules"])), group["name"]


def test_vmalert_loads_the_rule_file_without_keep_firing_for(tmp_path: Path) -> None:
    """Its expressions and annotation templates (``query``, ``sortByLabel`` included) as a live vmalert checks them."""
    groups = yaml.safe_load(vmalert_rules(RULES_FILE.read_text()))["groups"]
    assert not [r for g in groups for r in g["rules"] if "keep_firing_for" in r]
    assert set(holds()) == {a["alert"] for a in alerts()}
    rules = tmp_path / "modelkv-rules.yaml"
    rules.write_text(vmalert_rules(RULES_FILE.read_text()))
    checked = subprocess.run(
        [require_tool("vmalert"), "-dryRun", f"-rule={rules}", "-rule.validateTemplates", "-rule.validateExpressions"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr[-2000:]


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
    assert set(failures(victoria.episodes, victoria.answer, as_prometheus=True)) == READS_A_STOPPED_RECORD


def test_vmalerts_own_alert_states_miss_only_what_needs_keep_firing_for(victoria: Victoria) -> None:
    missed = set(failures(victoria.episodes, victoria.answer, as_prometheus=False))
    assert missed == MISSED_WITHOUT_KEEP_FIRING_FOR | READS_A_STOPPED_RECORD
