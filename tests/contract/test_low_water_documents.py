"""Documents with the floor of live tensors (``torch_allocated_low_water``): what the contract writes, the published
schema admits and the sidecar reads back; a document from a writer before the floor still reads (no floor, never 0),
and one with it keeps the oldest version, since a sidecar exports only the sources it knows."""

from __future__ import annotations

import json

import jsonschema

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.sidecar.growth import growth
from modelkv_exporter.sidecar.reader.decode import parse_snapshot
from modelkv_exporter.sidecar.samples import engine_samples
from modelkv_testbed import ROOT
from modelkv_testbed.snapshots import make_snapshot

SCHEMA = json.loads((ROOT / "docs" / "snapshot.schema.json").read_text())
MIB = 1024**2
BASE = {"torch_allocated": 1000 * MIB, "torch_allocated_high_water": 4000 * MIB, "torch_reserved": 5000 * MIB}


def floor_snapshot(source: str = "torch_allocated_low_water") -> Snapshot:
    now = {"torch_allocated": 1500 * MIB, "torch_allocated_high_water": 3000 * MIB, "torch_reserved": 5000 * MIB}
    return make_snapshot("e", measured={**now, source: 1400 * MIB}, baseline={**BASE, source: 1000 * MIB})


def exported(snapshot: Snapshot) -> dict[str, float]:
    found: dict[str, float] = {}
    engine_samples(snapshot, False, lambda name, labels, value: found.__setitem__(name, value), lambda *a: None, 16)
    return found


def test_the_floor_reads_back_equal_at_the_oldest_version_and_is_exported() -> None:
    snapshot = floor_snapshot()
    document = json.loads(snapshot.to_json())
    jsonschema.validate(document, SCHEMA)
    assert document["schema_version"] == 1, "an additive source: a version-1 sidecar reads it"
    assert parse_snapshot(snapshot.to_json()) == snapshot
    assert exported(snapshot)["modelkv_memory_torch_allocated_low_water_bytes"] == 1400 * MIB
    assert "modelkv_memory_torch_allocated_low_water_baseline_bytes" not in exported(snapshot), "torch_allocated's"
    judged = growth(snapshot)
    assert judged is not None and judged.live_tensors == 400 * MIB, "the floor above the live tensors then"


def test_a_document_without_the_floor_reads_as_none_and_judges_as_before() -> None:
    document = json.loads(floor_snapshot().to_json())
    del document["measured"]["current"]["values"]["torch_allocated_low_water"]
    del document["measured"]["baseline"]["values"]["torch_allocated_low_water"]
    read = parse_snapshot(json.dumps(document).encode())
    assert "modelkv_memory_torch_allocated_low_water_bytes" not in exported(read)
    judged = growth(read)
    assert judged is not None and judged.live_tensors == -1000 * MIB, "the high-water mark against its baseline"


def test_a_source_a_sidecar_does_not_know_is_read_and_not_exported() -> None:
    """What a sidecar from before the floor does with it: the same as this one with a source from after it."""
    snapshot = floor_snapshot("torch_allocated_some_later_figure")
    jsonschema.validate(json.loads(snapshot.to_json()), SCHEMA)
    read = parse_snapshot(snapshot.to_json())
    assert read == snapshot
    assert not [name for name in exported(read) if "later" in name]
