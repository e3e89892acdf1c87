"""Property-based hostile input: whatever a file holds, the reader answers with a snapshot or a
SnapshotError, and whatever it accepts renders to a valid exposition."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from modelkv_exporter.collector import SpoolCollector
from modelkv_exporter.snapshot_parse import SnapshotError, parse_snapshot
from modelkv_exporter.spool import SpoolReader, write_snapshot
from tests.conftest import make_declaration, make_snapshot

VALID = make_snapshot(
    "e", declarations=(make_declaration("a"), make_declaration("b", rows="fixed", rows_fixed=2)),
    measured={"process_resident": 5}, baseline={"process_resident": 4}, interval=5.0,
).to_dict()  # fmt: skip

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


def render(spool: Path) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpoolCollector(SpoolReader(spool)))
    text = generate_latest(registry).decode()
    list(text_string_to_metric_families(text))
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
        text = render(Path(spool))
    assert 'engine="' in text
