"""The floor of live tensors (``torch_allocated_low_water``): the real CUDA sampler against the stand-in of
``torch.cuda`` the hook's tests use, since no GPU exists here."""

from __future__ import annotations

from modelkv_exporter.engine import samplers as engine_memory
from modelkv_exporter.engine.samplers import HIGH_WATER_SECONDS, CudaSampler
from tests.engine.test_hook import Clock, FakeCuda

ACTIVATIONS = 3_000


def floor(sampler: CudaSampler) -> int:
    return sampler().values["torch_allocated_low_water"]


def test_the_floor_is_the_lowest_live_tensors_of_the_window_and_a_leak_raises_it() -> None:
    cuda, clock = FakeCuda(), Clock()
    sampler = CudaSampler(cuda, "cuda:0", clock=clock)
    baseline = sampler.initialised(profiled_activation_peak=ACTIVATIONS)
    assert baseline.values["torch_allocated_low_water"] == baseline.values["torch_allocated"] == 100
    readings = []
    for beat in range(48):  # four minutes of a busy engine: every other sample lands inside a step
        clock.now += 5
        mid_step = beat % 2 == 0
        if mid_step:
            cuda.allocate(ACTIVATIONS)
        cuda.allocate(1) if beat % 4 == 0 else None  # a leak of live tensors
        sample = sampler()
        readings.append(sample.values["torch_allocated_low_water"])
        assert sample.values["torch_allocated_low_water"] <= sample.values["torch_allocated"]
        if mid_step:
            cuda.free(ACTIVATIONS)
    assert max(readings) < 100 + ACTIVATIONS, "a sample between steps keeps the activations out of the floor"
    assert readings[-1] == 100 + 12 - 6, "the leak as it stood two minutes (24 samples, 6 of its bytes) ago"
    assert readings[-1] > readings[30] > 100, "the leak raises the floor"


def test_a_window_with_every_sample_inside_a_step_reads_the_activations_then_forgets_them() -> None:
    cuda, clock = FakeCuda(), Clock()
    sampler = CudaSampler(cuda, "cuda:0", clock=clock)
    sampler.initialised()
    cuda.allocate(ACTIVATIONS)
    clock.now += HIGH_WATER_SECONDS + 1
    assert floor(sampler) == 100 + ACTIVATIONS, "a sampled floor: only what the samples saw"
    cuda.free(ACTIVATIONS)
    clock.now += 5
    assert floor(sampler) == 100
    cuda.allocate(ACTIVATIONS)
    clock.now += HIGH_WATER_SECONDS - 1
    assert floor(sampler) == 100, "a quiet sample is seen for the whole window"
    clock.now += 2
    assert floor(sampler) == 100 + ACTIVATIONS


def test_the_floor_restarts_at_the_baseline_and_never_reaches_back_into_loading() -> None:
    cuda, clock = FakeCuda(), Clock()
    sampler = CudaSampler(cuda, "cuda:0", clock=clock)
    assert floor(sampler) == 100, "loading: the weights not yet in"
    cuda.allocate(16_000)
    clock.now += 5
    assert floor(sampler) == 100
    sampler.initialised()
    clock.now += 5
    assert floor(sampler) == 16_100


def test_where_torch_cannot_say_the_floor_is_absent_never_0() -> None:
    sampler = CudaSampler(FakeCuda(fail={"memory_allocated"}), "cuda:0")
    assert "torch_allocated_low_water" not in sampler.initialised().values
    assert "torch_allocated_low_water" not in sampler().values
    assert "torch_allocated_low_water" not in engine_memory.MemorySampler()().values, "a CPU engine: no torch figure"
