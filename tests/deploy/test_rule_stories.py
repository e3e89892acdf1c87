"""The story tests of the rules are generated from the simulation: current, physical and complete."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from modelkv_exporter.engine.vllm_hook.identity import data_parallel_index, engine_id_for
from modelkv_exporter.sidecar.catalogue import CATALOGUE
from modelkv_testbed import ROOT
from modelkv_testbed.processes import require_tool
from modelkv_testbed.promql import RULES_FILE
from modelkv_testbed.simulation.generate import expected_files
from modelkv_testbed.simulation.physics import GIB, Device, Engine, simulate, step
from modelkv_testbed.simulation.render import series
from modelkv_testbed.simulation.stories import STORIES

NOT_IN_ANY_STORY = {
    "modelkv_declarations_dropped": "no story engine drops a declaration (declarations.test.yaml has them)",
    "modelkv_discovery_census_exhausted": "no story engine's census runs out of its budget",
}


def test_the_story_files_are_current() -> None:
    for path, text in expected_files().items():
        assert path.exists(), f"{path.relative_to(ROOT)} missing: python -m modelkv_testbed.simulation.generate"
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} is stale: python -m modelkv_testbed.simulation.generate"
        )


def test_every_story_states_what_the_operator_expects_before_its_checks() -> None:
    for story in STORIES:
        assert story.situation.strip()
        for episode in story.episodes:
            assert "expects" in episode.expects, story.name
            assert episode.checks, story.name


def test_the_stories_feed_every_family_a_sidecar_exports() -> None:
    names: set[str] = set()
    for story in STORIES:
        for episode in story.episodes:
            found = series(episode.engines, simulate(episode.engines, episode.minutes), episode.minutes)
            names |= {name for name, _ in found}
    families = set(CATALOGUE)
    assert families - names == set(NOT_IN_ANY_STORY), sorted(families - names)
    assert names - families == {"up", "scrape_duration_seconds"}


def test_a_device_that_cannot_hold_its_engines_is_refused() -> None:
    """The relations are asserted: an engine that grows past its device's total cannot be simulated."""
    engine = Engine("e", "p", "10.0.0.1:9400", Device("GPU-small", total=70 * GIB), leak=step(10, 30 * GIB))
    simulate([replace(engine, leak=step(10, 0))], 20)
    with pytest.raises(AssertionError, match="device over-full"):
        simulate([engine], 20)


def test_a_hung_process_keeps_its_memory_on_the_device() -> None:
    device = Device("GPU-h")
    first = Engine("first", "p", "10.0.0.1:9400", device, paged_kv=10 * GIB)
    hung = Engine("hung", "p", "10.0.0.1:9400", device, paged_kv=10 * GIB, hung_at=5)
    timeline = simulate([first, hung], 90)
    used = [s.values["device_used"] for s in timeline.samples[first.key] if s is not None]
    assert used[0] == used[-1] == 2 * (16 + 10 + 1) * GIB
    assert timeline.heartbeats[hung.key][-1] == 4


def test_the_extensible_kv_story_fails_when_the_baseline_is_taken_before_the_final_commit(tmp_path: Path) -> None:
    """Break the baseline move on purpose: the vLLM 0.34 story's engines take it at the end of warm-up, as the
    hook did before, and promtool finds the start-up paging where the operator expects silence."""
    story = next(s for s in STORIES if s.name == "story-k-vllm-034-extensible-kv-cache")
    first = story.episodes[0]
    broken_engines = [
        replace(e, extensible=replace(e.extensible, baseline_at_warm_up=True)) if e.extensible else e
        for e in first.engines
    ]
    for name, episodes in (("kept", [first]), ("broken", [replace(first, engines=broken_engines)])):
        directory = tmp_path / name / "tests"
        directory.mkdir(parents=True)
        (directory.parent / "modelkv-rules.yaml").write_text(RULES_FILE.read_text())
        (directory / "story.test.yaml").write_text(replace(story, episodes=episodes).text())
        result = subprocess.run(
            [require_tool("promtool"), "test", "rules", "story.test.yaml"],
            capture_output=True,
            text=True,
            cwd=directory,
        )
        if name == "kept":
            assert result.returncode == 0, result.stdout + result.stderr
        else:
            assert result.returncode != 0, "a baseline before the final commit went unnoticed"
            said = result.stdout + result.stderr
            assert "ModelKVUndeclaredMemoryGrowth" in said, said
            assert 'engine="v034-graphs"' in said and 'engine="v034-sleeper"' in said, said


def test_replicas_named_by_their_data_parallel_rank_would_write_one_file() -> None:
    """The data-parallel story's ids are the hook's for vLLM's replicas (``data_parallel_rank`` 0 in each, the index
    their own). Break the id on purpose, named by the rank as before: the four replicas get one id, one file, and
    the simulation refuses them."""
    story = next(s for s in STORIES if s.name == "story-l-data-parallel-replicas")
    replicas = story.episodes[0].engines

    def ids(configs: list[SimpleNamespace]) -> list[str]:
        return [
            engine_id_for(
                {"served_model_name": "qwen3-8b", "dp_index": data_parallel_index(c), "tp_rank": 0, "pp_rank": 0}, None
            )
            for c in configs
        ]

    vllm = [SimpleNamespace(data_parallel_rank=0, data_parallel_index=i) for i in range(len(replicas))]
    assert ids(vllm) == [e.engine_id for e in replicas]
    by_rank = [SimpleNamespace(data_parallel_rank=0) for _ in replicas]
    broken = [replace(e, engine_id=i) for e, i in zip(replicas, ids(by_rank), strict=True)]
    with pytest.raises(AssertionError, match="two engines write one snapshot file"):
        simulate(broken, 30)
