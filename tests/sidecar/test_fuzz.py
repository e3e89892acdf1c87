"""Property-based hostile input: whatever a file holds, the reader answers with a snapshot or a
SnapshotError, whatever it accepts renders to a valid exposition, and the app answers 200 beside it.

The spool test draws spools of 10 hostile documents each, beside one valid snapshot that must
stay exported, and checks every rejected file is counted by reason: 200 spools (2 000
documents) in the tests, 1 000 spools (10 000 documents) under bench/reliability.sh.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.collector import SpoolCollector
from modelkv_exporter.sidecar.http.app import make_app
from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig
from modelkv_exporter.sidecar.reader.decode import SnapshotError, parse_snapshot
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.source import SpoolSource
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.snapshots import make_declaration, make_snapshot
from tests.support import FULL_SCALE
from tests.support.discovered import discovery_status, kv_layout, make_discovered, with_discovery

VALID = with_discovery(
    make_snapshot(
        "e", declarations=(make_declaration("a"), make_declaration("b", rows="fixed", rows_fixed=2)),
        measured={"process_resident": 5}, baseline={"process_resident": 4}, interval=5.0,
    ),
    (make_discovered(layout=kv_layout()), make_discovered("encoder.ring", found_by="census")),
    discovery_status(budget_exhausted="objects", below_floor=2),
).to_dict()  # fmt: skip
"""A valid document with every kind of field: declarations, measured memory, discovered owners and a status."""

nasty_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=()), max_size=300) | st.sampled_from(
    ["", "\n", '"', "\\", "\x00", "\ud800", "\u2028", "漢字", "x" * 5000]
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | nasty_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(nasty_text, inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


PATHS = [p for p in paths(VALID) if p]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    document = json.loads(json.dumps(VALID))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        path = draw(st.sampled_from(PATHS))
        parent = document
        try:
            for key in path[:-1]:
                parent = parent[key]
            if draw(st.booleans()):
                parent[path[-1]] = draw(json_values)
            elif isinstance(parent, dict):
                parent.pop(path[-1], None)
        except (KeyError, IndexError, TypeError):
            continue
    data = json.dumps(document, allow_nan=True).encode()
    cut = draw(st.integers(min_value=0, max_value=len(data)))
    return data if draw(st.booleans()) else data[:cut]


STRING_PATHS = [p for p in PATHS if isinstance(p[-1], str) and p[-1] not in ("scope", "rows", "dtype")]


@st.composite
def hostile_labels(draw: st.DrawFn) -> bytes:
    """A valid document whose free-text fields hold hostile text: it must be accepted and rendered safely."""
    document = json.loads(json.dumps(VALID))
    for path in draw(st.lists(st.sampled_from(STRING_PATHS), min_size=1, max_size=8)):
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent.get(path[-1]), str) or parent.get(path[-1]) is None:
            text = draw(nasty_text)
            parent[path[-1]] = text or "x" if path[-1] in ("engine_id", "name") else text
    return json.dumps(document).encode()


def render(spool: Path, now: float | None = None) -> str:
    """The spool's exposition, read at ``now`` (the clock's time when None)."""
    source = SpoolSource(SpoolReader(spool)) if now is None else SpoolSource(SpoolReader(spool), clock=lambda: now)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpoolCollector(source))
    text = generate_latest(registry).decode()
    list(Exposition(text))
    return text


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated() | hostile_labels() | st.binary(max_size=400))
def test_the_reader_answers_every_input_with_a_snapshot_or_a_reason(data: bytes) -> None:
    try:
        snapshot = parse_snapshot(data)
    except SnapshotError as error:
        assert error.reason.value and error.detail
        return
    with tempfile.TemporaryDirectory() as spool:
        write_snapshot(spool, snapshot)
        (Path(spool) / "other.json").write_bytes(data)
        text = render(Path(spool), now=snapshot.heartbeat_at)  # read as it was written: a slow run never forgets it
    assert 'engine="' in text


SPOOL_EXAMPLES = FULL_SCALE and 1000 or 200
DOCUMENTS_PER_SPOOL = 10
GOOD = make_snapshot("good-engine")


@pytest.fixture(scope="module")
def app_spool(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TestClient]:
    spool = tmp_path_factory.mktemp("fuzz-spool")
    return spool, TestClient(make_app(SidecarConfig(spool)))


@settings(max_examples=SPOOL_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        mutated() | hostile_labels() | st.binary(max_size=400),
        min_size=DOCUMENTS_PER_SPOOL,
        max_size=DOCUMENTS_PER_SPOOL,
    )
)
def test_a_spool_of_hostile_documents_never_fails_a_request_and_loses_nothing(
    app_spool: tuple[Path, TestClient], documents: list[bytes]
) -> None:
    spool, client = app_spool
    for old in spool.iterdir():
        old.unlink()
    write_snapshot(spool, GOOD)
    for i, data in enumerate(documents):
        (spool / f"doc-{i}.json").write_bytes(data)
    before = Counter(client.app.state.source.reader.rejections)  # type: ignore[attr-defined]
    responses = {
        "text": client.get("/metrics"),
        "gzip": client.get("/metrics", headers={"Accept-Encoding": "gzip"}),
        "openmetrics": client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}),
        "page": client.get("/"),
        "api": client.get("/api/v1/engines"),
    }
    assert {name: r.status_code for name, r in responses.items()} == dict.fromkeys(responses, 200)
    families = {f.name: f for f in Exposition(responses["text"].text)}
    list(Exposition(responses["openmetrics"].text, openmetrics=True))
    assert _stable(responses["gzip"].text) == _stable(responses["text"].text)
    engines = {s.labels["engine"] for s in families["modelkv_engine_up"].samples}
    assert "good-engine" in engines, "a valid snapshot beside hostile ones is still exported"

    api = responses["api"].json()
    rejected = Counter(r["reason"] for r in api["rejected"])
    counted = Counter(client.app.state.source.reader.rejections) - before  # type: ignore[attr-defined]
    assert counted == rejected, "every rejected file is counted once, by its reason"
    files = {s.labels["state"]: s.value for s in families["modelkv_exporter_spool_files"].samples}
    assert files["rejected"] == sum(rejected.values())
    assert sum(files.values()) == DOCUMENTS_PER_SPOOL + 1, "every file is exported, stale, ended or rejected"


def _stable(text: str) -> list[str]:
    moving = ("modelkv_exporter_collect_duration_seconds ", "modelkv_engine_snapshot_age_seconds{")
    return sorted(line for line in text.split("\n") if not line.startswith(moving))
