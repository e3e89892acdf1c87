"""The breakdown's rules on hand-made snapshots: each part from its own figure, the rest from the process figure.

The engine-side tests (``tests/engine/test_memory_parts.py``) check the parts against a device's books through
the real hook; here each rule of ``sidecar/breakdown.py`` is held on its own, with the case that would break it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from modelkv_exporter.contract.snapshot import SleepState, Snapshot
from modelkv_exporter.sidecar import breakdown as breakdown_module
from modelkv_exporter.sidecar.breakdown import breakdown, model_local_bytes, parts_text
from modelkv_testbed.snapshots import make_declaration, make_observation, make_snapshot
from tests.support.discovered import CENSUS, make_discovered

MIB = 1024**2
GIB = 1024**3


def host(**changes: object) -> Snapshot:
    snapshot = make_snapshot(
        "cpu",
        declarations=(make_declaration("kv", owner="talker"),),
        measured={"process_resident": 1000 * MIB},
        observations=(make_observation("talker", peak_bytes=40 * MIB, live_bytes=30 * MIB),),
    )
    settings = replace(snapshot.settings, weights_bytes=200 * MIB, runtime_bytes=700 * MIB)
    return replace(snapshot, settings=settings, **changes)


def device(values: dict[str, int] | None = None, **settings: object) -> Snapshot:
    """A device engine: 4 GiB of weights, a 1 GiB paged KV cache torch allocated, 300 MiB of graph pools, a 2 GiB
    activation allowance; torch holds 512 MiB free; the process holds 500 MiB of runtime besides."""
    torch_live = 4 * GIB + GIB + 300 * MIB
    figures = {
        "torch_allocated": torch_live,
        "torch_reserved": torch_live + 512 * MIB,
        "process_gpu": torch_live + 512 * MIB + 500 * MIB,
    }
    snapshot = make_snapshot("gpu", declarations=(), measured={**figures, **(values or {})})
    known = {
        "runtime_bytes": 500 * MIB,
        "weights_bytes": 4 * GIB,
        "paged_kv_bytes": GIB,
        "cuda_graph_bytes": 300 * MIB,
        "cuda_graph_free_bytes": 0,
        "activation_peak_bytes": 2 * GIB,
        **settings,
    }
    return replace(snapshot, settings=replace(snapshot.settings, **known))


def parts_of(snapshot: Snapshot) -> dict[str, int]:
    parts = breakdown(snapshot)
    assert parts is not None
    return dict(parts.parts)


def test_an_observed_owner_that_discovery_repeats_counts_once() -> None:
    silent = make_observation("vocoder", peak_bytes=9 * MIB, live_bytes=8 * MIB)
    snapshot = host()
    snapshot = replace(
        snapshot,
        observations=(*snapshot.observations, silent),
        discovered=(make_discovered("vocoder", peak_bytes=9 * MIB, live_bytes=8 * MIB),),
    )
    assert model_local_bytes(snapshot) == 38 * MIB, "talker's 30 MiB and the vocoder's 8 MiB, not 46 MiB"


def test_what_discovery_finds_beyond_a_declaring_owner_s_caches_adds_to_them() -> None:
    beyond = make_discovered("talker", found_by=CENSUS, peak_bytes=5 * MIB, live_bytes=4 * MIB, declares=True)
    undeclared = make_discovered("codec", found_by=CENSUS, peak_bytes=7 * MIB, live_bytes=6 * MIB)
    assert model_local_bytes(host(discovered=(beyond, undeclared))) == 40 * MIB


def test_an_owner_two_methods_found_counts_once_at_the_larger_figure() -> None:
    """Census and cache layer see the same memory of one owner: 6 MiB once, not 6 + 4 MiB (the rules take the
    larger too)."""
    by_layer = make_discovered("codec", peak_bytes=7 * MIB, live_bytes=6 * MIB)
    by_census = make_discovered("codec", found_by=CENSUS, peak_bytes=5 * MIB, live_bytes=4 * MIB)
    assert model_local_bytes(host(discovered=(by_layer, by_census))) == 36 * MIB


def test_a_declaring_owner_that_cannot_be_observed_makes_the_caches_and_the_rest_unknown() -> None:
    blind = host(observations=(make_observation("talker", reason="not observed yet", peak_bytes=None),))
    parts = breakdown(blind)
    assert parts is not None and model_local_bytes(blind) is None
    assert set(parts.parts) == {"runtime", "weights"} and not parts.complete, "absent, never 0; and the rest with it"


def test_a_host_engine_s_parts_split_its_resident_memory() -> None:
    parts = parts_of(host())
    assert parts == {
        "runtime": 700 * MIB,
        "weights": 200 * MIB,
        "model_local_caches": 30 * MIB,
        "unexplained": 70 * MIB,
    }


def test_the_rest_is_read_from_the_process_figure_so_memory_no_part_names_shows_there() -> None:
    """Memory made outside every part (NCCL's buffers, a library's workspace): the process figure grows, every part
    stays, and the rest grows by exactly that. A rest computed from the parts (a part that is what is left of the
    process figure, as `non_torch` was) would not move."""
    before = parts_of(device())
    grown = device({"process_gpu": device().measured.current.values["process_gpu"] + 700 * MIB})  # type: ignore[union-attr]
    after = parts_of(grown)
    assert before["unexplained"] == 0
    assert after["unexplained"] == 700 * MIB
    assert {k: v for k, v in after.items() if k != "unexplained"} == {
        k: v for k, v in before.items() if k != "unexplained"
    }


def test_a_device_engine_s_parts_are_each_its_own_figure() -> None:
    assert parts_of(device()) == {
        "runtime": 500 * MIB,
        "weights": 4 * GIB,
        "paged_kv": GIB,
        "cuda_graphs": 300 * MIB,
        "activation_peak": 512 * MIB,
        "model_local_caches": 0,
        "unexplained": 0,
    }


def test_the_activation_part_is_torch_s_free_blocks_up_to_the_activation_allowance() -> None:
    free = {"torch_reserved": device().measured.current.values["torch_allocated"] + 3 * GIB}  # type: ignore[union-attr]
    assert parts_of(device(free))["activation_peak"] == 2 * GIB, "at most the profiled peak"
    with_headroom = parts_of(device(free, torch_headroom_bytes=int(2.5 * GIB)))
    assert with_headroom["activation_peak"] == int(2.5 * GIB), "vLLM 0.34 keeps more free for torch: that allowance"
    assert "activation_peak" not in parts_of(device(free, activation_peak_bytes=None)), "no allowance: unknown"


def test_the_graph_pools_free_blocks_are_left_to_the_graphs() -> None:
    """Torch counts a graph pool's free blocks (the graphs' intermediate tensors, kept for replays) among its free
    blocks: the activation part leaves them out, and is unknown while the engine does not say how many there are."""
    pooled = {"torch_reserved": device().measured.current.values["torch_reserved"] + 200 * MIB}  # type: ignore[union-attr]
    pooled["process_gpu"] = device().measured.current.values["process_gpu"] + 200 * MIB  # type: ignore[union-attr]
    parts = parts_of(device(pooled, cuda_graph_bytes=500 * MIB, cuda_graph_free_bytes=200 * MIB))
    assert (parts["cuda_graphs"], parts["activation_peak"], parts["unexplained"]) == (500 * MIB, 512 * MIB, 0)
    unsaid = breakdown(device(pooled, cuda_graph_bytes=500 * MIB, cuda_graph_free_bytes=None))
    assert unsaid is not None and "activation_peak" not in unsaid.parts and not unsaid.complete
    eager = parts_of(device(cuda_graph_bytes=0, cuda_graph_free_bytes=None))
    assert eager["activation_peak"] == 512 * MIB, "an engine that captures no graphs has no graph pools to leave out"


def test_an_extensible_kv_cache_is_its_committed_figure_and_unknown_without_it() -> None:
    """vLLM 0.34's cache is mapped outside torch: its bytes are the sample's committed figure. A sample without it
    leaves the part (and the rest) unknown, rather than taking the last commit, which sleep may have released, and
    count the cache twice."""
    committed = device({"paged_kv_committed": 30 * GIB}, paged_kv_bytes=30 * GIB, paged_kv_reserved_bytes=60 * GIB)
    assert parts_of(committed)["paged_kv"] == 30 * GIB
    blind = device({}, paged_kv_bytes=30 * GIB, paged_kv_reserved_bytes=60 * GIB)
    parts = breakdown(blind)
    assert parts is not None and "paged_kv" not in parts.parts and not parts.complete
    assert "unknown: paged_kv" in parts_text(parts)


def test_an_engine_without_a_paged_kv_cache_is_not_missing_one() -> None:
    parts = breakdown(device(paged_kv_bytes=None))
    assert parts is not None and parts.complete and "paged_kv" not in parts.parts
    assert "unknown" not in parts_text(parts)


def test_what_the_sleep_allocator_holds_off_the_device_comes_off_its_part_never_below_zero() -> None:
    asleep = SleepState(level=1, released={"weights": 4 * GIB, "kv_cache": GIB, "runtime": 100 * MIB, "other": 5})
    values = {"process_gpu": device().measured.current.values["process_gpu"] - 5 * GIB - 100 * MIB}  # type: ignore[union-attr]
    parts = parts_of(replace(device(values), sleep=asleep))
    assert (parts["weights"], parts["paged_kv"], parts["runtime"]) == (0, 0, 400 * MIB)
    assert parts["cuda_graphs"] == 300 * MIB, "no cudagraph tag: vLLM before 0.34 keeps its graphs on the device"
    assert parts["unexplained"] == 0, "an `other` tag is no part's: it had been in the rest, if anywhere"
    over = SleepState(level=2, released={"weights": 6 * GIB})
    assert parts_of(replace(device(), sleep=over))["weights"] == 0, "a part is never negative"


def test_a_sleep_whose_books_could_not_be_read_leaves_the_parts_it_moves_unknown() -> None:
    parts = breakdown(replace(device(), sleep=SleepState(level=1, released=None)))
    assert parts is not None and not parts.complete
    assert set(parts.parts) == {"activation_peak", "model_local_caches"}


def test_without_the_runtime_the_rest_is_unknown() -> None:
    unmeasured = host()
    parts = breakdown(replace(unmeasured, settings=replace(unmeasured.settings, runtime_bytes=None)))
    assert parts is not None and not parts.complete and "unknown: runtime" in parts_text(parts)


def test_no_process_figure_no_breakdown_and_no_rest_without_nvml() -> None:
    assert breakdown(host(measured=replace(host().measured, current=None))) is None
    blind = make_snapshot("gpu", declarations=(), measured={"torch_reserved": 10 * MIB, "torch_allocated": 9 * MIB})
    parts = breakdown(blind)
    assert parts is not None and parts.total is None and not parts.complete


OVER_COUNTED = {
    "runtime": {"runtime_bytes": 500 * MIB + 64 * MIB},
    "weights": {"weights_bytes": 4 * GIB + 64 * MIB},
    "paged_kv": {"paged_kv_bytes": GIB + 64 * MIB},
    "cuda_graphs": {"cuda_graph_bytes": 300 * MIB + 64 * MIB},
}


@pytest.mark.parametrize("part", [*OVER_COUNTED, "model_local_caches"])
def test_a_part_that_counts_too_much_shows_as_a_negative_rest(part: str) -> None:
    """The rest is the error of the parts: a part that counts 64 MiB the process does not hold leaves the rest 64 MiB
    short, and every other part as it was."""
    truth = parts_of(device())
    if part == "model_local_caches":
        wrong = replace(device(), discovered=(make_discovered("ghost", peak_bytes=64 * MIB, live_bytes=64 * MIB),))
    else:
        wrong = device(**OVER_COUNTED[part])
    parts = parts_of(wrong)
    assert parts[part] == truth[part] + 64 * MIB and parts["unexplained"] == -64 * MIB
    assert {k: v for k, v in parts.items() if k not in (part, "unexplained")} == {
        k: v for k, v in truth.items() if k not in (part, "unexplained")
    }
    assert breakdown_module.COMPONENT_NAMES[-1] == "unexplained", "the rest stacks last"
