"""The memory breakdown over every story of the simulation: the exported parts add up to the process's figure.

The simulated sidecar renders each engine's snapshot with the real ``engine_samples``, so each
story's series carry ``modelkv_memory_breakdown_bytes`` as Prometheus would store it. Wherever an
engine's parts are complete (``unexplained`` present) they must sum to its process figure
(``process_gpu`` on a device engine, ``process_resident`` on a CPU engine) within the breakdown's
tolerance, at every minute of every story, starts, sleeps, leaks and restarts included; where the
process figure is unknown (no NVML), the parts stay and the rest is absent.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from modelkv_exporter.sidecar.breakdown import COMPONENT_NAMES, TOLERANCE_BYTES
from modelkv_testbed.simulation.physics import simulate
from modelkv_testbed.simulation.render import Labels, Series, series
from modelkv_testbed.simulation.stories import STORIES

PART = "modelkv_memory_breakdown_bytes"
TOTALS = ("modelkv_memory_process_gpu_bytes", "modelkv_memory_process_resident_bytes")


def _episodes() -> list[tuple[str, Series]]:
    return [
        (f"{story.name}/{index}", series(episode.engines, simulate(episode.engines, episode.minutes), episode.minutes))
        for story in STORIES
        for index, episode in enumerate(story.episodes)
    ]


EPISODES = _episodes()


def sums(found: Series) -> tuple[list[str], int, int]:
    """Every engine-minute whose complete parts do not add up to its process figure; how many were checked; and
    how many engine-minutes had parts but no process figure to split (NVML unavailable: no ``unexplained``)."""
    parts: dict[Labels, dict[str, list[float | None]]] = defaultdict(dict)
    totals: dict[Labels, dict[str, list[float | None]]] = defaultdict(dict)
    for (name, labels), values in found.items():
        if name == PART:
            component = dict(labels)["component"]
            parts[tuple(item for item in labels if item[0] != "component")][component] = values
        elif name in TOTALS:
            totals[labels][name] = values
    wrong, checked, without_total = [], 0, 0
    for labels, by_component in parts.items():
        assert set(by_component) <= set(COMPONENT_NAMES)
        device = "cuda_graphs" in by_component
        total_series = totals[labels].get(TOTALS[0] if device else TOTALS[1], [])
        rests = by_component.get("unexplained", [])
        for minute, weights in enumerate(by_component["weights"]):
            total = total_series[minute] if total_series else None
            rest = rests[minute] if rests else None
            if weights is None:
                continue
            if total is None:
                assert rest is None, "a rest without a process figure"
                without_total += 1
                continue
            values = [column[minute] for column in by_component.values() if column[minute] is not None]
            checked += 1
            if rest is None or abs(sum(values) - total) > TOLERANCE_BYTES:  # type: ignore[arg-type]
                wrong.append(f"{dict(labels)['engine']} at minute {minute}: {sum(values)} != {total}")  # type: ignore[arg-type]
    return wrong, checked, without_total


@pytest.mark.parametrize(("name", "found"), EPISODES, ids=[name for name, _ in EPISODES])
def test_the_parts_sum_to_the_process_figure_at_every_minute(name: str, found: Series) -> None:
    wrong, checked, without_total = sums(found)
    assert not wrong, wrong[:5]
    assert checked or without_total, f"{name}: no engine-minute with a breakdown"


def test_every_part_appears_in_some_story() -> None:
    seen = {dict(labels)["component"] for _, found in EPISODES for name, labels in found if name == PART}
    assert seen == set(COMPONENT_NAMES)


def test_a_part_missing_from_the_export_fails_the_sum() -> None:
    """The check can fail: drop one part's series from a story and the minutes it covered no longer add up."""
    name, found = EPISODES[0]
    broken = {
        key: values for key, values in found.items() if not (key[0] == PART and ("component", "non_torch") in key[1])
    }
    wrong, _, _ = sums(broken)
    assert wrong, f"{name}: the sum held without non_torch"


def test_a_leak_is_the_unexplained_part_and_the_rest_of_the_engine_holds_still() -> None:
    """vLLM 0.34's leaking engine: its unexplained part grows by the leak (0.15 GiB a minute from minute 60 to 130),
    while its weights, paged KV cache and non-torch parts stay as they were when it became ready."""
    name, found = next(item for item in EPISODES if item[0].startswith("story-k"))
    parts = {
        dict(labels)["component"]: values
        for (metric, labels), values in found.items()
        if metric == PART and dict(labels)["engine"] == "v034-leak"
    }
    leak = 3 * 1024**3 // 20
    rest = parts["unexplained"]
    assert rest[131] is not None and rest[59] is not None
    assert rest[131] - rest[59] == 70 * leak, name
    for steady in ("weights", "paged_kv", "non_torch"):
        assert parts[steady][131] == parts[steady][59], steady
