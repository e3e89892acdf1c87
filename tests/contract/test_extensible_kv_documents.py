"""Documents of an engine with vLLM 0.34's extensible KV cache: the reserved capacity and the committed bytes.

What the contract writes, the published schema admits and the sidecar's reader reads back whole; a
document from a writer before these fields still reads (as no extensible cache), and one with them
keeps the oldest version an older sidecar reads, which ignores the fields it does not know.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.sidecar.reader.decode import SnapshotError, parse_snapshot
from modelkv_testbed import ROOT
from modelkv_testbed.snapshots import make_snapshot

SCHEMA = json.loads((ROOT / "docs" / "snapshot.schema.json").read_text())
GOLDEN = ROOT / "tests" / "sidecar" / "golden" / "extensible-kv"
GIB = 1024**3


def extensible_snapshot() -> Snapshot:
    values = {"torch_allocated": 18 * GIB, "process_gpu": 70 * GIB, "paged_kv_committed": 50 * GIB}
    snapshot = make_snapshot("e034", measured=values, baseline=values)
    settings = replace(
        snapshot.settings,
        paged_kv_bytes=50 * GIB,
        paged_kv_blocks=200_000,
        paged_kv_reserved_bytes=120 * GIB,
        paged_kv_reserved_blocks=480_000,
    )
    return replace(snapshot, settings=settings)


def test_an_extensible_cache_reads_back_equal_at_the_oldest_version() -> None:
    snapshot = extensible_snapshot()
    document = json.loads(snapshot.to_json())
    jsonschema.validate(document, SCHEMA)
    assert document["schema_version"] == 1, "additive fields: a version-1 sidecar reads it and ignores them"
    assert parse_snapshot(snapshot.to_json()) == snapshot


def test_a_document_without_the_fields_reads_as_no_extensible_cache() -> None:
    document = json.loads(extensible_snapshot().to_json())
    del document["settings"]["paged_kv_reserved_bytes"], document["settings"]["paged_kv_reserved_blocks"]
    del document["measured"]["current"]["values"]["paged_kv_committed"]
    read = parse_snapshot(json.dumps(document).encode())
    assert read.settings.paged_kv_reserved_bytes is None and read.settings.paged_kv_reserved_blocks is None
    assert read.measured.current is not None and "paged_kv_committed" not in read.measured.current.values


@pytest.mark.parametrize("field", ["paged_kv_reserved_bytes", "paged_kv_reserved_blocks"])
@pytest.mark.parametrize("value", [-1, 1.5, "12", True])
def test_a_malformed_reserved_figure_is_rejected(field: str, value: object) -> None:
    document = json.loads(extensible_snapshot().to_json())
    document["settings"][field] = value
    with pytest.raises(SnapshotError, match=field):
        parse_snapshot(json.dumps(document).encode())


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.json")), ids=lambda p: Path(p).stem)
def test_the_golden_extensible_documents_validate_and_read(path: Path) -> None:
    document = json.loads(path.read_text())
    jsonschema.validate(document, SCHEMA)
    read = parse_snapshot(path.read_bytes())
    assert read.settings.paged_kv_reserved_blocks is not None
    assert read.measured.current is not None and "paged_kv_committed" in read.measured.current.values
