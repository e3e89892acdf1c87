"""One definition of a valid declaration: the sidecar's reader refuses a value with the very text the engine
drops a declaration with, because both ask ``contract/validity.py``."""

from __future__ import annotations

from typing import Any

import pytest

from modelkv_exporter.contract.snapshot import Declaration
from modelkv_exporter.contract.validity import declaration_problems, record_problems
from modelkv_exporter.sidecar.reader.decode import SnapshotError, snapshot_from_dict
from modelkv_testbed.snapshots import make_declaration, make_snapshot

BAD = [
    ("kv_heads", 2.5),
    ("layers", "6"),
    ("layers", True),
    ("physical_capacity_positions", -1),
    ("scope", "forever"),
    ("rows", "per_token"),
    ("name", ""),
    ("capacity_source", 7),
]


@pytest.mark.parametrize("field,value", BAD)
def test_the_reader_refuses_what_the_rules_refuse_with_the_same_words(field: str, value: Any) -> None:
    document = make_snapshot(declarations=(make_declaration(),)).to_dict()
    document["declarations"][0][field] = value
    with pytest.raises(SnapshotError) as refused:
        snapshot_from_dict(document)
    ((named, problem),) = record_problems(Declaration, {field: value})
    assert named == field
    assert refused.value.detail == f"snapshot.declarations[0].{field}: {problem}"


def test_the_arithmetic_is_one_rule_too() -> None:
    good = make_declaration()
    assert record_problems(Declaration, vars(good)) == [] and declaration_problems(good, 8) == []
    document = make_snapshot(declarations=(good,)).to_dict()
    document["declarations"][0]["peak_bytes"] += 1
    with pytest.raises(SnapshotError, match="peak_bytes"):
        snapshot_from_dict(document)
    assert [field for field, _ in declaration_problems(good, None)] == ["rows"], "per sequence needs max_num_seqs"
