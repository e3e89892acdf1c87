"""The rule file on sharded evaluation: two shards and a fleet-wide evaluator give every story its alerts.

Sharded by node (docs/deploy.md, "Sharded Prometheus"), each shard scrapes the pods a hashmod of their
node gives it (each simulated pod is on a node of its own: its instance stands for the node) and
evaluates every group but ``FLEET_GROUPS``; the fleet-wide evaluator reads every pod's series (what
federation brings it) and evaluates ``FLEET_GROUPS`` alone. Each of the three is a victoria-metrics
with a ``vmalert -replay`` over it (the tests of test_vmalert_stories.py hold vmalert to Prometheus):
the stories' checks, judged on the alerts of all three together, pass as they do unsharded. The
evaluation is replayed, so the delay a real federation scrape adds (one interval) is not in it. A
device's engines on two shards (a share of the pods, not of the nodes) is shown to lose the device.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from modelkv_testbed.promql import FLEET_GROUPS, RULES_FILE, rule_groups
from modelkv_testbed.simulation.on_victoria import (
    SPACING,
    Placed,
    failures,
    placed,
    replay_rules,
    replay_side_by_side,
    timeline,
)
from modelkv_testbed.simulation.replay import Labels, Timeline, episode_series
from modelkv_testbed.simulation.stories import STORIES
from modelkv_testbed.victoria import STALE, query, remote_write, running_victoria_metrics
from tests.deploy.test_vmalert_stories import MISSED_WITHOUT_KEEP_FIRING_FOR, READS_A_STOPPED_RECORD

pytestmark = pytest.mark.slow

SHARDS = 2


def shard_of(labels: Labels) -> int:
    """The shard that scrapes the series' target (a hashmod of its node; here, of its instance)."""
    return zlib.crc32(dict(labels)["instance"].encode()) % SHARDS


@dataclass
class Sharded:
    """The shards' and the fleet evaluator's victoria-metrics, and each episode's alerts from all of them."""

    shards: list[str]
    fleet: str
    episodes: list[tuple[Placed, Timeline]]
    spread: dict[str, set[int]]
    """Per story, the shards its pods landed on."""
    moved: tuple[Placed, Timeline, Timeline]
    """The shared-device story with its device's engines in two pods on two shards: unsharded (in the fleet's
    victoria-metrics, every group) and sharded."""

    def answer(self, episode: Placed, expr: str, minute: int) -> dict[Labels, float]:
        """``expr`` at ``minute`` of ``episode``, from whichever shard holds the series."""
        found: dict[Labels, float] = {}
        for url in self.shards:
            for r in query(url, expr, episode.base + minute * 60):
                found[tuple(sorted(r["metric"].items()))] = float(r["value"][1])
        return found


def moved_apart(base: int) -> Placed:
    """The shared-device story with one of GPU-s's two engines moved to a pod of its own, on the other shard."""
    story = next(s for s in STORIES if s.name == "story-c-shared-device-over-commit")
    episode = story.episodes[0]
    (stays,) = [e for e in episode.engines if e.engine_id == "tight-thinker"]
    home = shard_of((("instance", stays.instance),))
    away = next(f"10.3.1.{n}:9400" for n in range(1, 64) if shard_of((("instance", f"10.3.1.{n}:9400"),)) != home)
    engines = [replace(e, instance=away, pod="omni-1") if e.engine_id == "tight-talker" else e for e in episode.engines]
    return Placed(story, 0, replace(episode, engines=engines), base)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sharded]:
    tmp = tmp_path_factory.mktemp("sharded")
    shard_rules, fleet_rules = tmp / "shard.yaml", tmp / "fleet.yaml"
    shard_rules.write_text(replay_rules(RULES_FILE.read_text(), lambda name: name not in FLEET_GROUPS))
    fleet_rules.write_text(replay_rules(RULES_FILE.read_text(), lambda name: name in FLEET_GROUPS))
    every_rule = tmp / "all.yaml"
    every_rule.write_text(replay_rules(RULES_FILE.read_text()))
    episodes = placed()
    moved = moved_apart(episodes[-1].base + SPACING)
    spread: dict[str, set[int]] = {}
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(running_victoria_metrics(tmp / f"vm-{k}")) for k in range(SHARDS + 1)]
        shards, fleet = urls[:SHARDS], urls[SHARDS]
        runs = []
        for episode in episodes:
            found = episode_series(episode.episode, episode.base, STALE)
            remote_write(fleet, found)
            runs.append((fleet_rules, fleet, episode))
            for k, url in enumerate(shards):
                mine = {labels: points for labels, points in found.items() if shard_of(labels) == k}
                if mine:
                    spread.setdefault(episode.story.name, set()).add(k)
                    remote_write(url, mine)
                    runs.append((shard_rules, url, episode))
        found = episode_series(moved.episode, moved.base, STALE)
        remote_write(fleet, found)
        runs.append((every_rule, fleet, moved))
        for k, url in enumerate(shards):
            remote_write(url, {labels: points for labels, points in found.items() if shard_of(labels) == k})
            runs.append((shard_rules, url, moved))
        replay_side_by_side(runs)
        yield Sharded(
            shards,
            fleet,
            [(e, timeline(urls, e)) for e in episodes],
            spread,
            (moved, timeline([fleet], moved), timeline(shards, moved)),
        )


def test_the_groups_split_into_the_shards_and_the_fleets() -> None:
    names = [g["name"] for g in rule_groups()]
    assert names[-len(FLEET_GROUPS) :] == list(FLEET_GROUPS), "the fleet's groups read no shard's results"


def test_every_story_holds_sharded(sharded: Sharded) -> None:
    assert set().union(*sharded.spread.values()) == set(range(SHARDS)), "every shard scrapes some pods"
    assert [name for name, shards in sharded.spread.items() if len(shards) == SHARDS], "a story spans the shards"
    assert set(failures(sharded.episodes, sharded.answer, as_prometheus=True)) == READS_A_STOPPED_RECORD


def test_vmalerts_own_states_sharded_miss_what_they_miss_unsharded(sharded: Sharded) -> None:
    missed = set(failures(sharded.episodes, sharded.answer, as_prometheus=False))
    assert missed == MISSED_WITHOUT_KEEP_FIRING_FOR | READS_A_STOPPED_RECORD


def test_two_engines_of_one_device_on_two_shards_are_not_supported(sharded: Sharded) -> None:
    """Unsharded, the story holds with GPU-s's engines in two pods; with the pods on two shards, each shard adds up
    half the device's pending cache, and the device that cannot hold its engines' caches never pages."""
    moved, whole, split = sharded.moved
    unsharded = Sharded([sharded.fleet], sharded.fleet, [], {}, sharded.moved)
    assert failures([(moved, whole)], unsharded.answer, as_prometheus=True) == {}
    missed = failures([(moved, split)], sharded.answer, as_prometheus=True)
    assert set(missed) == {
        (moved.story.name, 0, "Value", "modelkv_engine:device_declared_pending_bytes:sum"),
        (moved.story.name, 0, "Firing", "ModelKVDeclaredPeakWillNotFit"),
    }, missed
