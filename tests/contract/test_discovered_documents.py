"""Documents with discovered owners: what the contract writes, the published schema admits and the sidecar's reader
reads back whole; what older writers wrote still reads, with no discovery at all."""

from __future__ import annotations

import json

import jsonschema
import pytest

from modelkv_exporter.sidecar.reader.decode import SnapshotError, parse_snapshot
from modelkv_testbed import ROOT
from tests.support.discovered import discovering_snapshot, discovery_status, golden_discovered_spool, with_discovery

SCHEMA = json.loads((ROOT / "docs" / "snapshot.schema.json").read_text())


def test_a_snapshot_with_discovered_owners_is_valid_and_reads_back_equal() -> None:
    snapshot = discovering_snapshot()
    document = json.loads(snapshot.to_json())
    jsonschema.validate(document, SCHEMA)
    assert parse_snapshot(snapshot.to_json()) == snapshot
    layouts = [d["layout"] for d in document["discovered"]]
    assert layouts[0] == {
        "layers": 8, "kv_heads": 16, "head_dim": 64, "dtype": "float32", "element_size": 4, "positions": 72, "rows": 4,
    } and layouts[2] is None  # fmt: skip


def test_discovery_off_reads_back_with_its_reason() -> None:
    off = with_discovery(discovering_snapshot(), (), discovery_status(enabled=False, reason="MODELKV_OBSERVE=0"))
    read = parse_snapshot(off.to_json())
    assert read.discovery is not None and not read.discovery.enabled and read.discovery.reason == "MODELKV_OBSERVE=0"
    assert read.discovered == ()


@pytest.mark.parametrize("name", sorted(golden_discovered_spool()))
def test_the_golden_discovered_documents_validate_and_read(name: str) -> None:
    data = golden_discovered_spool()[name]
    document = json.loads(data)
    jsonschema.validate(document, SCHEMA)
    read = parse_snapshot(data)
    if "discovered" not in document:
        assert read.discovered == () and read.discovery is None, "an older writer's document: no discovery"
    else:
        assert read.to_dict() == document


@pytest.mark.parametrize(
    "field,value",
    [("found_by", "census\nx"), ("peak_bytes", -1), ("layout", {"layers": 0}), ("declares", "no")],
)
def test_a_malformed_discovered_owner_is_rejected_with_its_place(field: str, value: object) -> None:
    document = discovering_snapshot().to_dict()
    document["discovered"][1][field] = value
    with pytest.raises(SnapshotError, match=r"snapshot\.discovered\[1\]"):
        parse_snapshot(json.dumps(document).encode())
