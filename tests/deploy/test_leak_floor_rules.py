"""The leak rule reads the floor of live tensors (issue 48): each part of it, broken on purpose, fails a story."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from modelkv_testbed.promql import RULES_FILE, rule_groups
from tests.deploy.test_rules import promtool_test

FLOOR = "min_over_time(modelkv_memory_torch_allocated_low_water_bytes[10m])"
HIGH_WATER = (
    "modelkv_memory_torch_allocated_high_water_bytes - modelkv_memory_torch_allocated_high_water_baseline_bytes"
)
THEN_HIGH_WATER = """            or
            label_replace(
              modelkv_memory_torch_allocated_high_water_bytes"""
BREAKS = {
    "the floor not read": (FLOOR, "modelkv_memory_torch_allocated_low_water_absent_bytes", "story-leaks-slow-leak"),
    "the floor at the last sample, not its lowest of 10 minutes": (
        FLOOR,
        "modelkv_memory_torch_allocated_low_water_bytes",
        "story-leaks-busy-engine",
    ),
    "the floor alone where it is reported, not the larger of it and the high-water mark": (
        THEN_HIGH_WATER,
        THEN_HIGH_WATER.replace("or", "or ignoring (figure)", 1),
        "story-l-data-parallel",
    ),
    "the floor against a baseline that includes the profiled activation peak": (
        f"{FLOOR}\n              - modelkv_memory_torch_allocated_baseline_bytes",
        f"{FLOOR}\n              - modelkv_memory_torch_allocated_high_water_baseline_bytes",
        "story-leaks-slow-leak",
    ),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_breaking_the_floor_fails_a_story(case: str, tmp_path: Path, passes_intact: Callable[[str], bool]) -> None:
    old, new, story = BREAKS[case]
    original = RULES_FILE.read_text()
    assert old in original, "the rule to break is no longer written this way"
    order = [g["name"] for g in rule_groups()]
    assert passes_intact(story), f"{story} fails with the rules as they are"
    result = promtool_test(original.replace(old, new), tmp_path / "broken", story, group_order=order)
    assert result.returncode != 0, f"{case}: the stories still pass"
    assert "ModelKVUndeclaredMemoryGrowth" in result.stdout + result.stderr
