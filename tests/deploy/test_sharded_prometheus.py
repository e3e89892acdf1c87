"""The rule file on sharded Prometheus, evaluated by Prometheus's own rule engine (promtool): the stories' alerts hold.

Sharded by node (docs/deploy.md, "Sharded Prometheus"): each episode's series are split by the
``hashmod`` of their pod's node into two shards, each evaluating every group but ``FLEET_GROUPS``;
the fleet's Prometheus evaluates ``FLEET_GROUPS`` over what it federates from the shards
(``FLEET_FEDERATION_MATCH``). Every simulated pod has a node of its own, named so that each
episode's pods spread over both shards. The alerts of the three together, minute by minute, pending
and firing, are those of one Prometheus over every series, and every check of every story holds on
them. Federation's delay (up to one interval) is not modelled: the fleet sees each sample when the
shard stores it.

Sharding by target (the Prometheus Operator's ``shards``, a ``hashmod`` of the address) puts two
pods of one device on two shards: each shard then adds up part of the device and counts its
engine alone on it, and the alerts differ (the device that cannot hold its caches never pages; an
engine without NVML figures is blamed for its neighbour's memory).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest

from modelkv_testbed import ROOT
from modelkv_testbed.polling import eventually
from modelkv_testbed.processes import require_tool
from modelkv_testbed.prometheus import running_prometheus
from modelkv_testbed.promql import FLEET_FEDERATION_MATCH, FLEET_GROUPS, metric_names, recorded_names, rule_groups
from modelkv_testbed.simulation.on_promtool import Part, Result, evaluate, rule_file
from modelkv_testbed.simulation.physics import simulate
from modelkv_testbed.simulation.render import Series, series
from modelkv_testbed.simulation.replay import Labels, Timeline, judge, parse_selector
from modelkv_testbed.simulation.stories import STORIES
from modelkv_testbed.simulation.story import Episode, Value

pytestmark = pytest.mark.slow

SHARDS = 2
Shard = Callable[[Labels], int]
"""The shard that scrapes a series' target."""


def hashmod(value: str, modulus: int) -> int:
    """Prometheus's relabelling ``hashmod``: the last 8 bytes of the value's MD5, big-endian, modulo ``modulus``."""
    return int.from_bytes(hashlib.md5(value.encode(), usedforsecurity=False).digest()[8:], "big") % modulus


def nodes(instances: list[str]) -> dict[str, str]:
    """A node of its own for each instance, named so that the k-th instance's node lands on shard k mod ``SHARDS``."""
    names = (f"gpu-node-{n}" for n in itertools.count())
    return {
        instance: next(name for name in names if hashmod(name, SHARDS) == k % SHARDS)
        for k, instance in enumerate(dict.fromkeys(instances))
    }


def by_node(node_of: dict[str, str]) -> Shard:
    """Sharded as docs/deploy.md says: a hashmod of the pod's node."""
    return lambda labels: hashmod(node_of[dict(labels)["instance"]], SHARDS)


def by_target(labels: Labels) -> int:
    """Sharded as the Prometheus Operator's ``shards`` do: a hashmod of the target's address."""
    return hashmod(dict(labels)["instance"], SHARDS)


def federated(found: Series) -> Series:
    """The series of a shard that the fleet's Prometheus federates (``FLEET_FEDERATION_MATCH``)."""
    matches = [dict(parse_selector(match)) for match in FLEET_FEDERATION_MATCH]
    return {
        (name, labels): values
        for (name, labels), values in found.items()
        if any(all({**dict(labels), "__name__": name}.get(k) == v for k, v in m.items()) for m in matches)
    }


@dataclass(frozen=True)
class Case:
    """One episode, split into shards: its series as a whole and per shard."""

    key: str
    episode: Episode
    whole: Series
    shards: tuple[Series, ...]


def case(key: str, episode: Episode, shard: Shard) -> Case:
    """The episode's series, whole and split by ``shard``."""
    found = series(episode.engines, simulate(episode.engines, episode.minutes), episode.minutes, episode.gaps)
    parts = tuple({k: v for k, v in found.items() if shard(k[1]) == n} for n in range(SHARDS))
    return Case(key, episode, found, parts)


@dataclass(frozen=True)
class Outcome:
    """One case evaluated unsharded and sharded (the shards and the fleet's Prometheus together)."""

    case: Case
    unsharded: Result
    sharded: Result


def merged(results: list[Result]) -> Result:
    """The alerts and answers of several Prometheus servers as one view (a firing alert outranks a pending one)."""
    out = Result()
    for result in results:
        for alert, by_labels in result.alerts.alerts.items():
            for labels, states in by_labels.items():
                mine = out.alerts.alerts.setdefault(alert, {}).setdefault(labels, {})
                for minute, state in states.items():
                    mine[minute] = "firing" if "firing" in (state, mine.get(minute)) else state
        for question, samples in result.answers.items():
            out.answers.setdefault(question, {}).update(samples)
    return out


def story_cases() -> list[Case]:
    """Every story's episodes, sharded by node, each pod on a node of its own."""
    found = []
    for story in STORIES:
        for index, episode in enumerate(story.episodes):
            node_of = nodes([e.instance for e in episode.engines])
            found.append(case(f"{story.name}:{index}", episode, by_node(node_of)))
    return found


def device_split(story_name: str, moved: str, pod: str) -> tuple[Episode, dict[str, str], str]:
    """The story's first episode with engine ``moved`` in a pod of its own (``pod``) on the node of the pod it left,
    at an address that the Operator's shards put on the other shard; and each instance's node."""
    story = next(s for s in STORIES if s.name == story_name)
    episode = story.episodes[0]
    (engine,) = [e for e in episode.engines if e.engine_id == moved]
    home = by_target((("instance", engine.instance),))
    away = next(f"10.99.0.{n}:9400" for n in range(1, 64) if by_target((("instance", f"10.99.0.{n}:9400"),)) != home)
    engines = [replace(e, instance=away, pod=pod) if e.engine_id == moved else e for e in episode.engines]
    node_of = nodes([e.instance for e in episode.engines])
    return replace(episode, engines=engines), {**node_of, away: node_of[engine.instance]}, away


def fleet_input(c: Case) -> Series:
    """What the fleet's Prometheus federates from every shard."""
    return {k: v for shard in c.shards for k, v in federated(shard).items()}


def delayed(found: Series) -> Series:
    """The series as a federation one interval behind the shards brings them: each minute's sample a minute late."""
    return {key: [None, *values[:-1]] for key, values in found.items()}


def on_shard(n: int) -> Callable[[Case], Series]:
    """A case's series on shard ``n``."""
    return lambda c: c.shards[n]


def fewer_declared() -> Episode:
    """The shared-device story with roomy-talker declaring no cache, while tight-talker (the same model and stage,
    on the other node) declares one: ModelKVDeclarationsDropped (fewer than before) pages from the fleet's groups."""
    episode = next(s for s in STORIES if s.name == "story-c-shared-device-over-commit").episodes[0]
    return replace(
        episode, engines=[replace(e, caches=()) if e.engine_id == "roomy-talker" else e for e in episode.engines]
    )


@dataclass
class Evaluated:
    """Every story sharded by node; two shared devices split by node and by target; a replica that declares less."""

    stories: list[Outcome]
    broken: dict[str, Outcome]
    fleet: dict[str, tuple[Timeline, Timeline]]
    """Per story episode, the fleet's alerts: federated at once, and a federation interval late."""


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Evaluated]:
    cases = story_cases()
    shared, shared_nodes, _ = device_split("story-c-shared-device-over-commit", "tight-talker", "omni-1")
    hung, hung_nodes, _ = device_split("story-d-hung-neighbour", "neighbour", "asr-1")
    broken = {
        "shared-by-node": case("shared-by-node", shared, by_node(shared_nodes)),
        "shared-by-target": case("shared-by-target", shared, by_target),
        "hung-by-node": case("hung-by-node", hung, by_node(hung_nodes)),
        "hung-by-target": case("hung-by-target", hung, by_target),
    }
    fewer = fewer_declared()
    broken["fewer-by-node"] = case("fewer-by-node", fewer, by_node(nodes([e.instance for e in fewer.engines])))
    every = [*cases, *broken.values()]

    def parts(found: Callable[[Case], Series]) -> list[Part]:
        return [
            Part(
                c.key,
                found(c),
                c.episode.minutes,
                tuple((v.expr, v.minute) for v in c.episode.checks if isinstance(v, Value)),
            )
            for c in every
        ]

    shard_rules = rule_file(lambda name: name not in FLEET_GROUPS)
    runs = [(rule_file(), parts(lambda c: c.whole))]
    runs += [(shard_rules, parts(on_shard(n))) for n in range(SHARDS)]
    fleet_rules = rule_file(lambda name: name in FLEET_GROUPS)
    runs.append((fleet_rules, parts(fleet_input)))
    runs.append((fleet_rules, parts(lambda c: delayed(fleet_input(c)))))
    whole, *apart, late = evaluate(require_tool("promtool"), runs, tmp_path_factory.mktemp("sharded-prometheus"))
    outcomes = {c.key: Outcome(c, whole[c.key], merged([run[c.key] for run in apart])) for c in every}
    yield Evaluated(
        [outcomes[c.key] for c in cases],
        {key: outcomes[key] for key in broken},
        {c.key: (apart[-1][c.key].alerts, late[c.key].alerts) for c in [*cases, broken["fewer-by-node"]]},
    )


def failed_checks(episode: Episode, result: Result) -> dict[tuple[str, str], str]:
    """The episode's checks that ``result`` fails (check, alert or expression) and why."""
    failed = {}
    for check in episode.checks:
        wrong = judge(check, result.alerts, lambda expr, minute: result.answers[(expr, minute)])
        if wrong is not None:
            failed[(type(check).__name__, getattr(check, "alert", getattr(check, "expr", "")))] = wrong
    return failed


def differences(outcome: Outcome) -> dict[tuple[str, Labels], tuple[dict[int, str], dict[int, str]]]:
    """Per alert and label set whose timeline differs: unsharded and sharded."""
    one, other = outcome.unsharded.alerts.alerts, outcome.sharded.alerts.alerts
    keys = {(a, labels) for side in (one, other) for a, by_labels in side.items() for labels in by_labels}
    found = {}
    for alert, labels in keys:
        before, after = one.get(alert, {}).get(labels, {}), other.get(alert, {}).get(labels, {})
        if before != after:
            found[(alert, labels)] = (before, after)
    return found


def test_the_fleet_federates_what_the_fleet_groups_read() -> None:
    fleet = [r for g in rule_groups() if g["name"] in FLEET_GROUPS for r in g["rules"]]
    read = set().union(*(metric_names(r["expr"]) for r in fleet)) - {r["record"] for r in fleet if "record" in r}
    assert not read & recorded_names(), "the fleet's groups read no shard's recorded series"
    assert {dict(parse_selector(m))["__name__"] for m in FLEET_FEDERATION_MATCH} == read
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert all(f"`{match}`" in deploy for match in FLEET_FEDERATION_MATCH), "docs/deploy.md names what to federate"


def test_hashmod_is_prometheus_s(tmp_path: Path) -> None:
    """Real Prometheus relabels targets by the ``hashmod`` of their node into the shards the tests compute."""
    names = [f"gpu-node-{n}" for n in range(16)]
    targets = "".join(
        f"      - {{targets: ['127.0.0.1:{1000 + n}'], labels: {{node: {name}}}}}\n" for n, name in enumerate(names)
    )
    relabel = "".join(
        f"      - {{source_labels: [node], modulus: {m}, target_label: shard_of_{m}, action: hashmod}}\n"
        for m in (2, 8)
    )
    config = (
        "global: {scrape_interval: 1h}\nscrape_configs:\n  - job_name: nodes\n    static_configs:\n"
        + targets
        + "    relabel_configs:\n"
        + relabel
    )
    with running_prometheus(tmp_path, config) as url:

        def relabelled() -> list[dict[str, str]]:
            found = httpx.get(url + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
            return [t["labels"] for t in found] if len(found) == len(names) else []

        labels = eventually(relabelled, "Prometheus to discover the targets")
    found = {t["node"]: (int(t["shard_of_2"]), int(t["shard_of_8"])) for t in labels}
    assert found == {name: (hashmod(name, 2), hashmod(name, 8)) for name in names}
    assert {shard for shard, _ in found.values()} == {0, 1}


def test_every_episode_on_two_or_more_nodes_spreads_over_both_shards(evaluated: Evaluated) -> None:
    spread = []
    for outcome in evaluated.stories:
        on = {n for n, shard in enumerate(outcome.case.shards) if any(k[0] == "up" for k in shard)}
        if len({e.instance for e in outcome.case.episode.engines}) > 1:
            assert on == set(range(SHARDS)), outcome.case.key
            spread.append(outcome.case.key)
    assert len(spread) >= 8, spread


def test_the_alerts_are_those_of_one_prometheus(evaluated: Evaluated) -> None:
    for outcome in evaluated.stories:
        assert outcome.unsharded.alerts.alerts, f"{outcome.case.key}: no alert ever, unsharded"
        assert differences(outcome) == {}, outcome.case.key
        assert outcome.sharded.answers == outcome.unsharded.answers, outcome.case.key


def test_every_story_holds_sharded(evaluated: Evaluated) -> None:
    for outcome in evaluated.stories:
        assert failed_checks(outcome.case.episode, outcome.unsharded) == {}, outcome.case.key
        assert failed_checks(outcome.case.episode, outcome.sharded) == {}, outcome.case.key


def device_shards(outcome: Outcome, device: str) -> set[int]:
    """The shards that scrape a pod with an engine on ``device``."""
    instances = {e.instance for e in outcome.case.episode.engines if e.device is not None and e.device.uuid == device}
    return {
        n
        for n, shard in enumerate(outcome.case.shards)
        for name, labels in shard
        if dict(labels)["instance"] in instances
    }


def test_a_devices_pods_on_one_node_keep_its_alerts(evaluated: Evaluated) -> None:
    for key, device in (("shared", "GPU-s"), ("hung", "GPU-h")):
        by_node, by_target = evaluated.broken[f"{key}-by-node"], evaluated.broken[f"{key}-by-target"]
        assert len(device_shards(by_node, device)) == 1, key
        assert device_shards(by_target, device) == set(range(SHARDS)), f"{key}: the Operator's shards split {device}"
        assert differences(by_node) == {}, key
    assert all(evaluated.broken["shared-by-node"].case.shards), "GPU-t's pod is on the other shard"


def test_a_shared_device_split_by_target_never_pages(evaluated: Evaluated) -> None:
    """GPU-s's engines in two pods on two shards: each adds up half the device's pending cache, which fits."""
    outcome = evaluated.broken["shared-by-target"]
    assert failed_checks(outcome.case.episode, outcome.unsharded) == {}
    assert set(failed_checks(outcome.case.episode, outcome.sharded)) == {
        ("Value", "modelkv_engine:device_declared_pending_bytes:sum"),
        ("Firing", "ModelKVDeclaredPeakWillNotFit"),
    }


def test_a_hung_neighbour_split_by_target_is_blamed_on_the_innocent(evaluated: Evaluated) -> None:
    """The engine without NVML figures, alone on its shard's view of the device, is charged with its neighbour's."""
    outcome = evaluated.broken["hung-by-target"]
    found = differences(outcome)
    assert {(alert, dict(labels)["engine"]) for alert, labels in found} == {
        ("ModelKVUndeclaredMemoryGrowth", "innocent")
    }, found
    ((before, after),) = found.values()
    assert before == {} and "firing" in after.values()


def test_federation_a_minute_late_delays_the_fleets_alerts_by_a_minute(evaluated: Evaluated) -> None:
    """The fleet's alerts over input a minute late are its alerts over prompt input a minute later, and no other:
    besides, only ModelKVExporterAbsent pending in the first minute, before the first federation."""
    compared = 0
    for key, (prompt, late) in evaluated.fleet.items():
        minutes = next(
            o.case.episode.minutes for o in [*evaluated.stories, *evaluated.broken.values()] if o.case.key == key
        )
        shifted = Timeline()
        for alert, by_labels in prompt.alerts.items():
            for labels, states in by_labels.items():
                for minute, state in states.items():
                    if minute < minutes:
                        shifted.alerts.setdefault(alert, {}).setdefault(labels, {})[minute + 1] = state
        absent = late.alerts.get("ModelKVExporterAbsent", {})
        assert absent.pop((("job", "modelkv-exporter"), ("severity", "info")), {}) == {0: "pending"}, key
        if not absent:
            late.alerts.pop("ModelKVExporterAbsent", None)
        assert late.alerts == shifted.alerts, key
        compared += "ModelKVDeclarationsDropped" in shifted.alerts
    assert compared, "a fleet alert fires"


def test_a_replica_that_declares_less_pages_from_the_fleets_prometheus(evaluated: Evaluated) -> None:
    """Its shard sees no other replica of the model: the page comes from what the fleet's Prometheus federates."""
    outcome = evaluated.broken["fewer-by-node"]
    assert all(outcome.case.shards), "the replicas are on two shards"
    dropped = {
        dict(labels)["engine"]: states
        for labels, states in outcome.unsharded.alerts.alerts.get("ModelKVDeclarationsDropped", {}).items()
    }
    assert set(dropped) == {"roomy-talker"} and "firing" in dropped["roomy-talker"].values(), dropped
    assert differences(outcome) == {}
    prompt, _ = evaluated.fleet["fewer-by-node"]
    assert "ModelKVDeclarationsDropped" in prompt.alerts, "it pages from the fleet's groups"
