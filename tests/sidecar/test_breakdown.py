"""The breakdown's rules on hand-made snapshots: model-local caches counted once, unknown parts absent, the rest.

The engine-side test (``tests/engine/test_memory_parts.py``) checks the parts against a device's books; here each
rule of ``sidecar/breakdown.py`` is held on its own, with the case that would break it.
"""

from __future__ import annotations

from dataclasses import replace

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.sidecar.breakdown import breakdown, model_local_bytes
from modelkv_testbed.snapshots import make_declaration, make_observation, make_snapshot
from tests.support.discovered import CENSUS, make_discovered

MIB = 1024**2


def host(**changes: object) -> Snapshot:
    snapshot = make_snapshot(
        "cpu",
        declarations=(make_declaration("kv", owner="talker"),),
        measured={"process_resident": 1000 * MIB},
        observations=(make_observation("talker", peak_bytes=40 * MIB, live_bytes=30 * MIB),),
    )
    return replace(snapshot, settings=replace(snapshot.settings, weights_bytes=200 * MIB), **changes)


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


def test_a_declaring_owner_that_cannot_be_observed_makes_the_caches_and_the_rest_unknown() -> None:
    blind = host(observations=(make_observation("talker", reason="not observed yet", peak_bytes=None),))
    parts = breakdown(blind)
    assert parts is not None and model_local_bytes(blind) is None
    assert set(parts.parts) == {"weights"} and not parts.complete, "absent, never 0; and the rest with it"


def test_a_host_engine_s_parts_split_its_resident_memory() -> None:
    parts = breakdown(host())
    assert parts is not None and parts.total_source == "process_resident" and parts.complete
    assert dict(parts.parts) == {"weights": 200 * MIB, "model_local_caches": 30 * MIB, "unexplained": 770 * MIB}


def test_no_process_figure_no_breakdown_and_no_rest_without_nvml() -> None:
    assert breakdown(host(measured=replace(host().measured, current=None))) is None
    device = make_snapshot("gpu", declarations=(), measured={"torch_reserved": 10 * MIB, "torch_allocated": 9 * MIB})
    parts = breakdown(device)
    assert parts is not None and parts.total is None and "non_torch" not in parts.parts and not parts.complete
