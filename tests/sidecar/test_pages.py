"""The landing page and the JSON document: cached per spool change, the JSON joined from one piece per file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.budget import Budget
from modelkv_exporter.sidecar.http import pages as pages_module
from modelkv_exporter.sidecar.http.pages import Pages
from modelkv_exporter.sidecar.source import SpoolSource
from modelkv_testbed.snapshots import make_declaration, make_snapshot
from tests.support.discovered import discovery_status, make_discovered, with_discovery
from tests.support.engines_document import engines_document


def test_the_joined_document_is_the_whole_document(spool: Path) -> None:
    write_snapshot(spool, make_snapshot("a", declarations=(make_declaration("x\u202e"),)))
    write_snapshot(spool, make_snapshot("b", interval=1.0, heartbeat_at=0.0 + 1))
    found = tuple(make_discovered(f"m.{i}") for i in range(3))
    write_snapshot(spool, with_discovery(make_snapshot("c"), found, discovery_status()))
    (spool / "bad.json").write_text("{")
    source = SpoolSource.budgeted(spool, budget=Budget(sidecar_max_discovered_owners=2))
    body = Pages(source).engines()
    assert json.loads(body) == json.loads(json.dumps(engines_document(source.view(), "spool", 2)))
    (discovering,) = [e for e in json.loads(body)["engines"] if e["snapshot"]["engine"]["engine_id"] == "c"]
    assert discovering["discovered_owners_omitted"] == 1


def test_a_change_encodes_one_piece_again(spool: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b", "c"):
        write_snapshot(spool, make_snapshot(name))
    pages = Pages(SpoolSource.budgeted(spool, budget=Budget()))
    encoded: list[str] = []
    real = pages_module.json_body

    def counting(document: dict) -> bytes:
        encoded.append(document.get("file", "(fields)"))
        return real(document)

    monkeypatch.setattr(pages_module, "json_body", counting)
    pages.engines()
    assert sorted(encoded) == ["(fields)", "a.json", "b.json", "c.json"]
    encoded.clear()
    write_snapshot(spool, replace(make_snapshot("b"), writer="again"))
    document = json.loads(pages.engines())
    assert sorted(encoded) == ["(fields)", "b.json"]
    assert [e["snapshot"]["writer"] for e in document["engines"]] == ["tests", "again", "tests"]
