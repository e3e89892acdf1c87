"""The memory breakdown over every story of the simulation: each exported part is what the physics knows it holds.

The simulated sidecar renders each engine's snapshot as the hook writes it (its runtime after
``init_device``, its weights, its paged KV cache, the graph pools torch's private pools grew by across
the capture, the activation peak vLLM profiled, what the sleep allocator holds off the device) and the
real ``engine_samples`` export ``modelkv_memory_breakdown_bytes`` from it, as Prometheus would store
it. The physics knows what each part truly holds at every minute, and what memory no part names (a
leak, memory made outside torch, free blocks beyond the activation allowance, caches that nothing finds,
freed heap a CPU engine keeps). At every minute of every story at which an engine is ready and fresh,
each exported part must be the physics' figure, and ``unexplained`` the memory no part names: not a
sum of the parts, which would hold whatever the parts said. The graph pools are free blocks between
replays (the physics captures them so): torch counts them among its free blocks, and the activation
part must leave them to the graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from modelkv_exporter.sidecar.breakdown import COMPONENT_NAMES, UNEXPLAINED
from modelkv_testbed.simulation.physics import Engine, Sample, Timeline, simulate
from modelkv_testbed.simulation.render import Labels, Series, series
from modelkv_testbed.simulation.stories import STORIES
from modelkv_testbed.simulation.story import Episode, engine_labels

PART = "modelkv_memory_breakdown_bytes"
HOST_PARTS = {"runtime", "weights", "model_local_caches", UNEXPLAINED}


def _episodes() -> list[tuple[str, Episode, Timeline]]:
    return [
        (f"{story.name}/{index}", episode, simulate(episode.engines, episode.minutes))
        for story in STORIES
        for index, episode in enumerate(story.episodes)
    ]


EPISODES = _episodes()


def _labels(engine: Engine, component: str) -> Labels:
    """The labels of one of the engine's parts as the sidecar exports them (a dense model's empty stage too)."""
    return tuple(sorted({**engine_labels(engine), "stage": engine.stage, "component": component}.items()))


def expected(engine: Engine, sample: Sample) -> dict[str, int]:
    """What the breakdown must export for ``sample``: the physics' parts."""
    assert sample.truth is not None
    return dict(sample.truth)


def measures_every_part(engine: Engine) -> bool:
    """Whether the hook knows every part and the process figure: NVML (or a CPU engine's resident memory) and an
    observer for its declaring owners."""
    return (engine.device is None or engine.nvml) and (engine.observes or not engine.caches)


def mismatches(engines: list[Engine], timeline: Timeline, found: Series) -> tuple[list[str], int]:
    """Every ready, fresh engine-minute whose exported parts are not the physics' figures; how many were checked."""
    wrong: list[str] = []
    checked = 0
    for engine in engines:
        components = HOST_PARTS if engine.device is None else set(COMPONENT_NAMES)
        for minute, sample in enumerate(timeline.samples[engine.key]):
            if sample is None or sample.truth is None or timeline.heartbeats[engine.key][minute] != minute:
                continue
            exported = {
                c: value
                for c in COMPONENT_NAMES
                if (value := found.get((PART, _labels(engine, c)), [None] * (minute + 1))[minute]) is not None
            }
            if UNEXPLAINED not in exported:
                if measures_every_part(engine):
                    wrong.append(f"{engine.engine_id} at minute {minute}: no {UNEXPLAINED} ({sorted(exported)})")
                continue
            checked += 1
            want = expected(engine, sample)
            if set(exported) != components or any(exported[c] != want[c] for c in components):
                got = {c: exported.get(c) for c in sorted(components)}
                wrong.append(
                    f"{engine.engine_id} at minute {minute}: exported {got}, physics {dict(sorted(want.items()))}"
                )
    return wrong, checked


def test_every_exported_part_is_what_the_physics_knows_at_every_minute() -> None:
    for name, episode, timeline in EPISODES:
        found = series(episode.engines, timeline, episode.minutes)
        wrong, checked = mismatches(episode.engines, timeline, found)
        assert not wrong, (name, wrong[:3])
        complete = [e for e in episode.engines if measures_every_part(e)]
        assert checked or not complete, f"{name}: no engine-minute with a complete breakdown"


def test_every_part_appears_in_some_story() -> None:
    seen = {
        dict(labels)["component"]
        for _, episode, timeline in EPISODES
        for name, labels in series(episode.engines, timeline, episode.minutes)
        if name == PART
    }
    assert seen == set(COMPONENT_NAMES)


def _story(prefix: str) -> tuple[str, Episode, Timeline]:
    return next(item for item in EPISODES if item[0].startswith(prefix))


def _with_samples(timeline: Timeline, change: Callable[[Sample], Sample]) -> Timeline:
    """``timeline`` with every sample changed by ``change``."""
    samples = {key: [s if s is None else change(s) for s in values] for key, values in timeline.samples.items()}
    return Timeline(samples, timeline.heartbeats)


def _graphs_as_capture_model_returns(sample: Sample) -> Sample:
    if "cuda_graph_bytes" not in sample.recorded or sample.capture_drop is None:
        return sample
    return replace(sample, recorded={**sample.recorded, "cuda_graph_bytes": sample.capture_drop})


def test_the_graph_figure_capture_model_returns_counts_the_neighbour_and_the_check_fails() -> None:
    """Break the graph figure on purpose: the bytes vLLM's ``capture_model`` returns (the drop in the device's free
    memory across the capture) in place of torch's private-pool growth. The neighbour that allocated during the
    capture lands in ``cuda_graphs`` and the rest goes negative by as much: the check sees it."""
    name, episode, timeline = _story("story-n")
    wrong, _ = mismatches(episode.engines, timeline, series(episode.engines, timeline, episode.minutes))
    assert not wrong, wrong[:3]
    broken = _with_samples(timeline, _graphs_as_capture_model_returns)
    wrong, _ = mismatches(episode.engines, broken, series(episode.engines, broken, episode.minutes))
    assert wrong, f"{name}: the neighbour's allocation in the graph figure went unnoticed"
    assert any("'cuda_graphs'" in line for line in wrong), wrong[:3]


def test_graph_pools_free_blocks_taken_for_activations_and_the_check_fails() -> None:
    """Break the graph pools' free blocks on purpose: a hook that records the pools but not how much of them is free
    blocks. The activation part then takes them for activations, counting them a second time, and the rest goes
    negative by as much: the check sees it."""
    name, episode, timeline = _story("story-n")
    broken = _with_samples(
        timeline, lambda sample: replace(sample, recorded={**sample.recorded, "cuda_graph_free_bytes": 0})
    )
    wrong, _ = mismatches(episode.engines, broken, series(episode.engines, broken, episode.minutes))
    assert any("'activation_peak'" in line for line in wrong), f"{name}: the graph pools counted twice went unnoticed"


def test_a_sleep_without_the_allocators_books_leaves_the_parts_on_the_device_and_the_check_fails() -> None:
    """Break the sleep books on purpose: a hook that publishes the level but not what the sleep allocator holds off
    the device. The weights and the KV cache then stay in their parts while NVML's figure dropped."""
    name, episode, timeline = _story("story-k")
    broken = _with_samples(timeline, lambda sample: replace(sample, off_device={}))
    wrong, _ = mismatches(episode.engines, broken, series(episode.engines, broken, episode.minutes))
    assert any("'weights'" in line for line in wrong), f"{name}: parts kept while asleep went unnoticed"


def test_a_leak_is_the_unexplained_part_and_the_rest_of_the_engine_holds_still() -> None:
    """vLLM 0.34's leaking engine: its unexplained part grows by the leak (0.15 GiB a minute from minute 60 to 130),
    while its runtime, weights and paged KV cache parts stay as they were when it became ready."""
    name, episode, timeline = _story("story-k")
    found = series(episode.engines, timeline, episode.minutes)
    parts = {
        dict(labels)["component"]: values
        for (metric, labels), values in found.items()
        if metric == PART and dict(labels)["engine"] == "v034-leak"
    }
    leak = 3 * 1024**3 // 20
    rest = parts[UNEXPLAINED]
    assert rest[131] is not None and rest[59] is not None
    assert rest[131] - rest[59] == 70 * leak, name
    for steady in ("runtime", "weights", "paged_kv"):
        assert parts[steady][131] == parts[steady][59], steady
