"""One declaration per field: the encoder, the decoder, the JSON Schema and the docs all follow it.

A toy dataclass declared with ``snapshot_field`` goes through the same derivations as the snapshot: a
bound declared once is enforced by the reader and stated by the schema and the reference, an
absent field reads as its declared default, and a field declared without ``snapshot_field`` is refused
instead of silently escaping the reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import jsonschema
import pytest

from modelkv_exporter.contract import snapshot
from modelkv_exporter.contract.fields import fields_of, snapshot_field
from modelkv_exporter.sidecar.reader import decode
from modelkv_exporter.sidecar.reader.decode import RejectReason, SnapshotError, parse_snapshot
from modelkv_testbed import ROOT
from modelkv_testbed.snapshots import make_observation, make_snapshot
from scripts import snapshot_schema as schema


@dataclass(frozen=True)
class Toy:
    """A toy object."""

    size: int = snapshot_field("how big", minimum=3)
    label: str = snapshot_field("what it is called", absent="unnamed")
    ratio: float | None = snapshot_field("a share", default=None, maximum=1)


def read(document: object) -> Toy:
    result: Toy = decode._object_reader(Toy)(document, "toy", 1)
    return result


def test_a_bound_declared_once_is_enforced_stated_and_documented() -> None:
    assert read({"size": 3, "label": "x", "ratio": 0.5}) == Toy(3, "x", 0.5)
    for bad in ({"size": 2}, {"size": True}, {"size": 4, "ratio": 1.5}, {"label": "x"}):
        with pytest.raises(SnapshotError) as caught:
            read(bad)
        assert caught.value.reason is RejectReason.INVALID_SNAPSHOT
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema.object_schema(Toy))
    toy_schema = schema.object_schema(Toy)
    assert toy_schema["required"] == ["size"]
    assert toy_schema["properties"]["size"]["minimum"] == 3
    assert toy_schema["properties"]["ratio"]["anyOf"][0]["maximum"] == 1


def test_an_absent_or_null_field_reads_as_its_declared_default() -> None:
    assert read({"size": 5}) == Toy(5, "unnamed", None)
    assert read({"size": 5, "label": None}) == Toy(5, "unnamed", None)
    jsonschema.validate({"size": 5, "label": None}, schema.object_schema(Toy))


def test_the_encoder_writes_every_declared_field_in_order() -> None:
    assert snapshot._encoder(Toy)(Toy(4, "y")) == {"size": 4, "label": "y", "ratio": None}
    document = make_snapshot("e", observations=(make_observation("decoder"),)).to_dict()
    assert list(document) == ["schema_version", *(f.name for f in fields_of(snapshot.Snapshot))]


def test_a_field_declared_without_wire_is_refused() -> None:
    """Broken on purpose: a plain dataclass field would escape every derivation, so it is an error."""

    @dataclass(frozen=True)
    class Careless:
        size: int = 0

    with pytest.raises(TypeError, match="Careless.size is declared without snapshot_field"):
        fields_of(Careless)


def test_the_published_schema_is_the_derived_one_and_reads_what_the_reader_reads() -> None:
    published = json.loads((ROOT / "docs" / "snapshot.schema.json").read_text())
    assert published == schema.json_schema()
    jsonschema.Draft202012Validator.check_schema(published)
    document = replace(make_snapshot("e", max_num_seqs=None), dropped_declarations=()).to_dict()
    jsonschema.validate(document, published)
    assert parse_snapshot(json.dumps(document).encode()).settings.max_num_seqs is None


WRITTEN_BEFORE = {
    1: ["one-engine/qwen3-tts-s1-r0.json", "observed/qwen3-tts-s1-r0.json", "states/fresh.json", "states/ended.json"],
    2: ["no-max-num-seqs/qwen-image-s2-r1.json"],
}
"""Golden spool documents of each version that the earlier, hand-written encoder made (valid ones)."""


@pytest.mark.parametrize("version", sorted(WRITTEN_BEFORE))
def test_documents_of_each_version_written_before_the_field_table_still_read(version: int) -> None:
    for name in WRITTEN_BEFORE[version]:
        data = (ROOT / "tests" / "sidecar" / "golden" / name).read_bytes()
        assert json.loads(data)["schema_version"] == version
        read = parse_snapshot(data)
        assert read.to_dict()["schema_version"] == version, "written back with the same version"


@dataclass(frozen=True)
class Dial:
    """A toy object with a bounded integer."""

    position: int = snapshot_field("where it points", minimum=1, maximum=9)


def test_an_integer_maximum_is_enforced_by_the_reader_as_the_schema_states() -> None:
    """The reader once took every integer up to 2^63-1 whatever the declaration said: 10 read, the schema refused it."""
    reader = decode._object_reader(Dial)
    assert reader({"position": 9}, "dial", 1) == Dial(9)
    with pytest.raises(SnapshotError, match=r"dial.position: 10 is outside \[1, 9\]"):
        reader({"position": 10}, "dial", 1)
    assert schema.object_schema(Dial)["properties"]["position"]["maximum"] == 9
