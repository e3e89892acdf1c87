"""The prescription against the simulation's engines: the KV cache to give vLLM is what the physics says fits.

For every ready, fresh, awake GPU engine-minute of every story whose every part is measured, the physics
knows what the engine holds besides its paged KV cache (each part of ``Sample.truth``), the activation
peak it was profiled with, what its model-local caches hold at most at its max_num_seqs (each declaring
owner the larger of its declared peak and the most it held; each undeclared owner that discovery publishes,
the most it held) and its device's total and share. The right answer is the requested memory less all of that
less the margin; computed here from the physics, not by the sidecar's function.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import pytest

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.thresholds import PRESCRIPTION_MARGIN_RATIO
from modelkv_exporter.sidecar import prescription as prescription_module
from modelkv_exporter.sidecar.prescription import prescription
from modelkv_testbed.simulation import render
from modelkv_testbed.simulation.physics import DISCOVERY_FLOOR, Engine, Sample, simulate
from modelkv_testbed.simulation.stories import STORIES

SHARE = 0.9
"""The gpu_memory_utilization every simulated GPU engine records (``render.snapshot``)."""


def snapshot(engine: Engine, sample: Sample, minute: int) -> Snapshot:
    """The engine's rendered snapshot, as the contract has it: ``render`` also publishes each declaring owner as
    discovered, with the most its observed caches held as its peak, where the contract reads a declaring owner's
    discovered figures as what it holds beyond its declared caches (nothing, in the physics); those entries are
    left out here, as a real engine would not publish them."""
    rendered = render.snapshot(engine, sample, minute)
    return replace(rendered, discovered=tuple(d for d in rendered.discovered if not d.declares))


def _engine_minutes() -> Iterator[tuple[str, Engine, Sample, int]]:
    for story in STORIES:
        for episode in story.episodes:
            timeline = simulate(episode.engines, episode.minutes)
            for engine in episode.engines:
                if engine.device is None or not engine.nvml or (engine.caches and not engine.observes):
                    continue
                for minute, sample in enumerate(timeline.samples[engine.key]):
                    fresh = timeline.heartbeats[engine.key][minute] == minute
                    if sample is not None and sample.truth is not None and fresh and not sample.sleep_level:
                        yield story.name, engine, sample, minute


ENGINE_MINUTES = list(_engine_minutes())


def model_local_peak(engine: Engine, sample: Sample) -> int:
    """The most the engine's model-local caches hold at its max_num_seqs, from the physics."""
    declared: dict[str, int] = {}
    for cache in engine.caches:
        rows = cache.fixed_rows if cache.fixed_rows is not None else engine.max_num_seqs
        declared[cache.owner] = declared.get(cache.owner, 0) + cache.row_bytes * rows
    peak = sum(max(bytes_, sample.held.get(owner, (0, 0))[1]) for owner, bytes_ in declared.items())
    undeclared: dict[str, int] = {}
    for (owner, _), (_, most) in sample.discovered.items():
        if engine.discovers and most >= DISCOVERY_FLOOR:
            undeclared[owner] = max(undeclared.get(owner, 0), most)
    return peak + sum(undeclared.values())


def physics_answer(engine: Engine, sample: Sample) -> int:
    """The KV cache to give vLLM, as the physics knows it."""
    assert engine.device is not None and sample.truth is not None
    requested = math.floor(engine.device.total * SHARE)
    truth = sample.truth
    held = truth["runtime"] + truth["weights"] + truth["cuda_graphs"] + truth["unexplained"]
    activations = max(engine.profiled_activation_peak, truth["activation_peak"])
    needs = held + activations + model_local_peak(engine, sample)
    return requested - needs - math.ceil(requested * PRESCRIPTION_MARGIN_RATIO)


def test_the_simulation_has_engines_of_every_kind_to_prescribe_for() -> None:
    stories = {name for name, *_ in ENGINE_MINUTES}
    assert len(ENGINE_MINUTES) > 1000 and len(stories) > 10, (len(ENGINE_MINUTES), stories)
    assert any(e.extensible is not None for _, e, _, _ in ENGINE_MINUTES), "vLLM 0.34's extensible KV cache"
    assert any(e.undeclared for _, e, _, _ in ENGINE_MINUTES) and any(e.caches for _, e, _, _ in ENGINE_MINUTES)


def test_every_simulated_engine_is_prescribed_what_its_physics_says_fits() -> None:
    wrong = []
    for story, engine, sample, minute in ENGINE_MINUTES:
        found = prescription(snapshot(engine, sample, minute))
        want = physics_answer(engine, sample)
        if found.kv_cache_bytes != want:
            wrong.append(f"{story}/{engine.engine_id} at {minute}: {found.kv_cache_bytes} != {want} ({found.reason})")
    assert not wrong, "\n".join(wrong[:20])


def test_the_difference_and_the_equivalent_utilization_follow_what_vllm_chose() -> None:
    """The equivalent share where it is one (at most 1), else none and why: both kinds occur in the simulation."""
    kinds = set()
    for story, engine, sample, minute in ENGINE_MINUTES:
        if engine.extensible is not None:
            continue
        found = prescription(snapshot(engine, sample, minute))
        want = physics_answer(engine, sample)
        assert found.difference == want - engine.paged_kv, story
        assert engine.device is not None
        requested = math.floor(engine.device.total * SHARE)
        equivalent = SHARE * (requested - engine.paged_kv + want) / requested
        if equivalent <= 1:
            assert found.gpu_memory_utilization == pytest.approx(equivalent), story
        else:
            assert found.gpu_memory_utilization is None and found.utilization_reason is not None, story
            assert found.utilization_reason.startswith(f"above 1 ({equivalent:.4f})"), story
        kinds.add(equivalent <= 1)
    assert kinds == {True, False}


def test_an_extensible_kv_cache_is_told_the_headroom_to_keep_free() -> None:
    story, engine, sample, minute = next(m for m in ENGINE_MINUTES if m[1].extensible is not None)
    found = prescription(snapshot(engine, sample, minute))
    assert found.kept_headroom_bytes == engine.profiled_activation_peak, story
    assert found.headroom_bytes == engine.profiled_activation_peak + engine.paged_kv - physics_answer(engine, sample)


def test_a_sleeping_engine_gets_no_prescription_with_the_reason() -> None:
    for story in STORIES:
        for episode in story.episodes:
            timeline = simulate(episode.engines, episode.minutes)
            for engine in episode.engines:
                for minute, sample in enumerate(timeline.samples[engine.key]):
                    if sample is not None and sample.sleep_level and sample.truth is not None:
                        found = prescription(snapshot(engine, sample, minute))
                        assert found.kv_cache_bytes is None and found.reason is not None
                        assert found.reason.startswith("asleep"), found.reason
                        return
    pytest.fail("no sleeping engine in the simulation")


def test_a_prescription_without_its_margin_or_its_model_local_peak_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the mechanism on purpose: no margin, then model-local caches at what they hold now, not their peak."""
    story, engine, sample, minute = next(m for m in ENGINE_MINUTES if m[1].caches and m[2].truth)
    rendered = snapshot(engine, sample, minute)
    assert prescription(rendered).kv_cache_bytes == physics_answer(engine, sample)
    monkeypatch.setattr(prescription_module, "PRESCRIPTION_MARGIN_RATIO", 0.0)
    assert prescription(rendered).kv_cache_bytes != physics_answer(engine, sample), "the margin is checked"
    monkeypatch.undo()
    monkeypatch.setattr(prescription_module.Demand, "peak_at", lambda self, n: 0)
    broken = prescription(rendered).kv_cache_bytes
    assert broken is not None and broken > physics_answer(engine, sample), story
