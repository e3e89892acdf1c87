"""The page's growth (``sidecar.growth``) judges as the rules do: the same simulated engines, fed to promtool and to
the page's function, give the same unexplained growth at several minutes of the stories."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from modelkv_exporter.contract.snapshot import Measured, MemorySample, Snapshot
from modelkv_exporter.sidecar.growth import growth
from modelkv_testbed.processes import require_tool
from modelkv_testbed.promql import RULES_FILE
from modelkv_testbed.simulation.physics import Timeline, simulate
from modelkv_testbed.simulation.render import selector, snapshot
from modelkv_testbed.simulation.stories import STORIES
from modelkv_testbed.simulation.story import Episode, Expectation, Story, Value, engine_labels

UNDECLARED = "modelkv_engine:undeclared_memory_bytes"
FLOOR_WINDOW = 10
"""Minutes over which the rule reads the floor's lowest (``min_over_time(...[10m])``)."""


def window_samples() -> int:
    """How many one-minute samples a 10-minute range holds: Prometheus 2 includes the range's start, 3 does not."""
    said = subprocess.run([require_tool("promtool"), "--version"], capture_output=True, text=True).stdout
    major = int(said.split("version ", 1)[1].split(".", 1)[0])
    return FLOOR_WINDOW + 1 if major < 3 else FLOOR_WINDOW


MINUTES = {
    "story-leaks-slow-leak-from-the-floor": (30, 60, 80, 200, 400),
    "story-leaks-busy-engine-and-a-stopped-leak": (10, 15, 24, 40, 60, 100, 300),
    "story-f-undeclared-cache": (25, 40, 60),
    "story-g-cpu-heap-after-warm-up": (20, 60, 150),
}


def as_the_rule_reads_it(found: Snapshot, timeline: Timeline, key: tuple[str, str], minute: int) -> Snapshot:
    """The snapshot with its floor replaced by the lowest the rule reads over its window: the page has one
    snapshot, the rule ten minutes of them."""
    current = found.measured.current
    if current is None or "torch_allocated_low_water" not in current.values:
        return found
    window = [s for s in timeline.samples[key][max(0, minute - window_samples() + 1) : minute + 1] if s is not None]
    lowest = min(s.values["torch_allocated_low_water"] for s in window if "torch_allocated_low_water" in s.values)
    values = {**current.values, "torch_allocated_low_water": lowest}
    return replace(found, measured=Measured(MemorySample(current.sampled_at, values), found.measured.baseline))


def page_checks(episode: Episode, minutes: tuple[int, ...], windowed: bool) -> list[Expectation]:
    timeline = simulate(episode.engines, episode.minutes)
    checks: list[Expectation] = []
    for minute in minutes:
        for engine in episode.engines:
            sample, beat = timeline.samples[engine.key][minute], timeline.heartbeats[engine.key][minute]
            if sample is None or beat is None or beat != minute:
                continue
            found = snapshot(engine, sample, beat)
            if windowed:
                found = as_the_rule_reads_it(found, timeline, engine.key, minute)
            judged = growth(found)
            series = selector(UNDECLARED, tuple(sorted(engine_labels(engine).items())))
            expected = () if judged is None or judged.unexplained is None else ((series, float(judged.unexplained)),)
            checks.append(Value(f'{UNDECLARED}{{engine="{engine.engine_id}"}}', minute, expected))
    return checks


def run_promtool(story: Story, episode: Episode, checks: list[Expectation], directory: Path) -> str:
    (directory / "tests").mkdir(parents=True)
    (directory / RULES_FILE.name).write_text(RULES_FILE.read_text())
    (directory / "tests" / "page.test.yaml").write_text(
        replace(story, episodes=[replace(episode, checks=checks)]).text()
    )
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", "page.test.yaml"],
        capture_output=True,
        text=True,
        cwd=directory / "tests",
    )
    return "" if result.returncode == 0 else result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(MINUTES))
def test_the_page_judges_unexplained_growth_as_the_rules_do(name: str, tmp_path: Path) -> None:
    story = next(s for s in STORIES if s.name == name)
    episode = story.episodes[0]
    checks = page_checks(episode, MINUTES[name], windowed=True)
    assert len(checks) >= len(MINUTES[name])
    assert any(c.samples and c.samples[0][1] > 0 for c in checks), "some growth to judge"
    failed = run_promtool(story, episode, checks, tmp_path)
    assert not failed, failed


def test_the_page_reads_the_latest_floor_higher_than_the_rules_only_while_it_rises(tmp_path: Path) -> None:
    """Without the rule's window the page's figure for a rising floor differs (the test above is not empty), and for
    a floor that stopped rising 10 minutes ago it is the same."""
    story = next(s for s in STORIES if s.name == "story-leaks-slow-leak-from-the-floor")
    episode = story.episodes[0]
    rising = [c for c in page_checks(episode, (200,), windowed=False) if "old-hook" not in c.expr]
    assert run_promtool(story, episode, rising, tmp_path / "rising"), "the page's latest floor, no window"
    stopped = next(s for s in STORIES if s.name == "story-leaks-busy-engine-and-a-stopped-leak")
    steady = page_checks(stopped.episodes[0], (110, 200, 300), windowed=False)
    assert not run_promtool(stopped, stopped.episodes[0], steady, tmp_path / "steady")
