"""Snapshot round trip, atomic writes, and every kind of bad spool input: skipped and counted."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from modelkv_exporter.contract.snapshot import SCHEMA_VERSION, DroppedDeclaration
from modelkv_exporter.contract.spool import snapshot_file_name, write_snapshot
from modelkv_exporter.sidecar.reader.decode import RejectReason, SnapshotError, parse_snapshot
from modelkv_exporter.sidecar.reader.scan import FULL_SCAN_EVERY_SECONDS, SETTLE_NS, SpoolReader, read_snapshot_file
from modelkv_testbed import ROOT
from modelkv_testbed.snapshots import make_declaration, make_observation, make_snapshot

SCHEMA = json.loads((ROOT / "docs" / "snapshot.schema.json").read_text())


def document(**changes: object) -> dict:
    doc = make_snapshot(
        "e", interval=5.0, measured={"process_resident": 10}, baseline={"process_resident": 5}
    ).to_dict()
    doc.update(changes)
    return doc


def test_round_trip_is_lossless_and_matches_the_published_schema(spool: Path) -> None:
    snapshot = make_snapshot(
        "stage-1/replica 0",
        declarations=(make_declaration("a"), make_declaration("b", rows="fixed", rows_fixed=3, scope="model")),
        interval=5.0,
        measured={"torch_allocated": 1, "process_resident": 2},
        baseline={"torch_allocated": 0},
        stage_id=1,
        stage_name="talker",
        tp_rank=0,
        observations=(make_observation("a"), make_observation("b", reason="no call yet"), make_observation("")),
    )
    path = write_snapshot(spool, snapshot)
    assert path.name == snapshot_file_name("stage-1/replica 0") and "/" not in path.name
    assert read_snapshot_file(path, 1 << 20) == snapshot
    jsonschema.validate(json.loads(path.read_bytes()), SCHEMA)
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in spool.iterdir()] == [path.name]


def test_file_names_are_distinct_and_safe() -> None:
    names = {snapshot_file_name(e) for e in ("a/b", "a_b", "a b", "..", ".hidden", "a" * 300, "ok-1.2")}
    assert len(names) == 7
    assert all(not n.startswith(".") and "/" not in n and len(n) < 220 for n in names)
    assert snapshot_file_name("ok-1.2") == "ok-1.2.json"


def test_dropped_declarations_round_trip_and_older_writers_report_none() -> None:
    dropped = (
        DroppedDeclaration("talker", "Talker", "declarer_raised", 1, "RuntimeError: boom"),
        DroppedDeclaration("", "Root", "a_reason_from_a_newer_hook", 2),
    )
    snapshot = replace(make_snapshot("e"), dropped_declarations=dropped)
    again = parse_snapshot(snapshot.to_json())
    assert again.dropped_declarations == dropped and again.dropped_count == 3
    jsonschema.validate(snapshot.to_dict(), SCHEMA)
    older = {k: v for k, v in snapshot.to_dict().items() if k != "dropped_declarations"}
    assert parse_snapshot(json.dumps(older).encode()).dropped_count is None, "not reported is not zero"


def test_older_and_unknown_fields_are_read_newer_versions_are_refused() -> None:
    doc = document(future_field={"x": 1}, schema_version=SCHEMA_VERSION)
    doc["engine"]["future_identity"] = "y"
    assert parse_snapshot(json.dumps(doc).encode()).engine.engine_id == "e"
    with pytest.raises(SnapshotError) as caught:
        parse_snapshot(json.dumps(document(schema_version=SCHEMA_VERSION + 1)).encode())
    assert caught.value.reason is RejectReason.UNSUPPORTED_VERSION and "upgrade the sidecar" in str(caught.value)


def test_an_unavailable_observation_has_no_figures_and_an_old_document_none() -> None:
    observed = make_observation("decoder", peak_bytes=5, calls=3)
    doc = document(observations=[{**vars(observed), "available": False, "reason": "graph replay"}])
    (read,) = parse_snapshot(json.dumps(doc).encode()).observations
    assert not read.available and read.reason == "graph replay" and read.calls == 3
    assert read.peak_bytes is read.recent_peak_bytes is read.live_bytes is read.cache_calls is None
    old = {k: v for k, v in document().items() if k != "observations"}
    assert parse_snapshot(json.dumps(old).encode()).observations == ()


def _observation_with(**change: object) -> dict:
    return document(observations=[{**vars(make_observation("decoder")), **change}])


def test_a_snapshot_without_max_num_seqs_is_version_2_and_every_other_stays_version_1() -> None:
    without = make_snapshot("diffusion", max_num_seqs=None, interval=5.0)
    doc = without.to_dict()
    assert doc["schema_version"] == 2 and doc["settings"]["max_num_seqs"] is None
    jsonschema.validate(doc, SCHEMA)
    assert parse_snapshot(without.to_json()) == without
    assert document()["schema_version"] == 1, "an ordinary snapshot stays readable by version-1 sidecars"
    jsonschema.validate(document(), SCHEMA)


def test_a_version_1_sidecar_asks_for_an_upgrade_instead_of_calling_the_snapshot_invalid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from modelkv_exporter.sidecar.reader import decode

    monkeypatch.setattr(decode, "SCHEMA_VERSION", 1)
    assert parse_snapshot(json.dumps(document()).encode()).settings.max_num_seqs == 8
    with pytest.raises(SnapshotError) as caught:
        parse_snapshot(make_snapshot("diffusion", max_num_seqs=None).to_json())
    assert caught.value.reason is RejectReason.UNSUPPORTED_VERSION and "upgrade the sidecar" in str(caught.value)


@pytest.mark.parametrize(
    "version,rows,problem",
    [
        (1, "fixed", "settings.max_num_seqs: required field is missing"),
        (2, "max_num_seqs", "needs settings.max_num_seqs"),
    ],
    ids=["version 1 requires it", "per-sequence rows need it"],
)
def test_what_an_absent_max_num_seqs_may_not_do(version: int, rows: str, problem: str) -> None:
    doc = document(schema_version=version)
    doc["settings"]["max_num_seqs"] = None
    doc["declarations"][0]["rows"] = rows
    if rows == "fixed":
        doc["declarations"][0].update(rows_fixed=8)
    with pytest.raises(SnapshotError) as caught:
        parse_snapshot(json.dumps(doc).encode())
    assert caught.value.reason is RejectReason.INVALID_SNAPSHOT and problem in str(caught.value)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


def _declaration_with(**change: object) -> dict:
    doc = document()
    doc["declarations"][0].update(change)
    return doc


BAD_DOCUMENTS: dict[str, tuple[bytes, RejectReason]] = {
    "truncated": (json.dumps(document()).encode()[:-40], RejectReason.INVALID_JSON),
    "not utf-8": (b'{"schema_version": 1, "x": "\xff"}', RejectReason.INVALID_JSON),
    "NaN": (
        json.dumps(document()).replace('"started_at":', '"started_at": NaN, "x":').encode(),
        RejectReason.INVALID_JSON,
    ),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, RejectReason.INVALID_JSON),
    "huge integer": (
        json.dumps(document()).replace('"max_num_seqs": 8', '"max_num_seqs": ' + "9" * 5000).encode(),
        RejectReason.INVALID_JSON,
    ),
    "list root": (b"[]", RejectReason.INVALID_SNAPSHOT),
    "missing engine": (
        json.dumps({k: v for k, v in document().items() if k != "engine"}).encode(),
        RejectReason.INVALID_SNAPSHOT,
    ),
    "string layers": (json.dumps(_declaration_with(layers="8")).encode(), RejectReason.INVALID_SNAPSHOT),
    "bool layers": (json.dumps(_declaration_with(layers=True)).encode(), RejectReason.INVALID_SNAPSHOT),
    "negative bytes": (json.dumps(_declaration_with(peak_bytes=-1)).encode(), RejectReason.INVALID_SNAPSHOT),
    "2^64 bytes": (json.dumps(_declaration_with(peak_bytes=2**64)).encode(), RejectReason.INVALID_SNAPSHOT),
    "inconsistent peak": (json.dumps(_declaration_with(peak_bytes=12345)).encode(), RejectReason.INVALID_SNAPSHOT),
    "unknown scope": (json.dumps(_declaration_with(scope="forever")).encode(), RejectReason.INVALID_SNAPSHOT),
    "unknown driver": (json.dumps(_declaration_with(rows="max_num_tokens")).encode(), RejectReason.INVALID_SNAPSHOT),
    "zero max_num_seqs": (json.dumps(document(settings={"max_num_seqs": 0})).encode(), RejectReason.INVALID_SNAPSHOT),
    "float timestamp inf": (json.dumps(document(heartbeat_at=1e300)).encode(), RejectReason.INVALID_SNAPSHOT),
    "empty engine id": (json.dumps(document(engine={"engine_id": ""})).encode(), RejectReason.INVALID_SNAPSHOT),
    "odd source name": (
        json.dumps(document(measured={"current": {"sampled_at": 1, "values": {'a"}': 1}}})).encode(),
        RejectReason.INVALID_SNAPSHOT,
    ),
    "negative measurement": (
        json.dumps(document(measured={"current": {"sampled_at": 1, "values": {"torch_allocated": -5}}})).encode(),
        RejectReason.INVALID_SNAPSHOT,
    ),
    "duplicate declaration": (
        json.dumps(document(declarations=[document()["declarations"][0]] * 2)).encode(),
        RejectReason.INVALID_SNAPSHOT,
    ),
    "dropped count 0": (
        json.dumps(
            document(dropped_declarations=[{"owner": "a", "owner_class": "A", "reason": "declarer_raised", "count": 0}])
        ).encode(),
        RejectReason.INVALID_SNAPSHOT,
    ),
    "dropped odd reason": (
        json.dumps(
            document(dropped_declarations=[{"owner": "a", "owner_class": "A", "reason": 'x"}', "count": 1}])
        ).encode(),
        RejectReason.INVALID_SNAPSHOT,
    ),
    "dropped not a list": (json.dumps(document(dropped_declarations={"a": 1})).encode(), RejectReason.INVALID_SNAPSHOT),
    "version 0": (json.dumps(document(schema_version=0)).encode(), RejectReason.INVALID_SNAPSHOT),
    "negative observed bytes": (
        json.dumps(_observation_with(peak_bytes=-1)).encode(),
        RejectReason.INVALID_SNAPSHOT,
    ),
    "observed availability as text": (
        json.dumps(_observation_with(available="yes")).encode(),
        RejectReason.INVALID_SNAPSHOT,
    ),
    "observations not a list": (json.dumps(document(observations={"a": 1})).encode(), RejectReason.INVALID_SNAPSHOT),
    "owner observed twice": (
        json.dumps(document(observations=[vars(make_observation("decoder"))] * 2)).encode(),
        RejectReason.INVALID_SNAPSHOT,
    ),
    "started after its heartbeat": (
        json.dumps(document(started_at=2_000_000_000.0, heartbeat_at=1_900_000_000.0)).encode(),
        RejectReason.INVALID_SNAPSHOT,
    ),
    "version string": (json.dumps(document(schema_version="1")).encode(), RejectReason.INVALID_SNAPSHOT),
}


BEYOND_SCHEMA = {"inconsistent peak", "duplicate declaration", "owner observed twice", "started after its heartbeat"}
"""Arithmetic and uniqueness are checked in code; JSON Schema cannot say them."""


@pytest.mark.parametrize("case", BAD_DOCUMENTS, ids=list(BAD_DOCUMENTS))
def test_bad_documents_are_rejected_with_their_reason(case: str) -> None:
    data, reason = BAD_DOCUMENTS[case]
    with pytest.raises(SnapshotError) as caught:
        parse_snapshot(data)
    assert caught.value.reason is reason
    if reason is RejectReason.INVALID_SNAPSHOT and case not in BEYOND_SCHEMA and data.startswith(b"{"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(json.loads(data), SCHEMA)


def test_lone_surrogates_and_control_characters_are_kept_safely() -> None:
    doc = document()
    raw = json.dumps(doc).replace('"owner": "decoder"', '"owner": "dec\\ud800o\\u0007der\\n\\"x\\""')
    assert "ud800" in raw
    snapshot = parse_snapshot(raw.encode())
    owner = snapshot.declarations[0].owner
    owner.encode("utf-8")
    assert owner.startswith("dec") and "\n" in owner


def test_reader_skips_and_counts_every_bad_file_and_keeps_the_good_ones(spool: Path) -> None:
    write_snapshot(spool, make_snapshot("good-1"))
    write_snapshot(spool, make_snapshot("good-2"))
    for i, (data, _) in enumerate(BAD_DOCUMENTS.values()):
        (spool / f"bad-{i:02}.json").write_bytes(data)
    with open(spool / "huge.json", "wb") as handle:
        handle.truncate(100 * 1024 * 1024)
    (spool / "link.json").symlink_to(spool / snapshot_file_name("good-1"))
    (spool / "dangling.json").symlink_to(spool / "nowhere")
    (spool / "dir.json").mkdir()
    os.mkfifo(spool / "fifo.json")
    (spool / "notes.txt").write_text("ignored: not a snapshot")
    (spool / ".good-3.json.tmp").write_text("ignored: a writer's temp file")
    impostor = make_snapshot("good-1", heartbeat_at=time.time() + 100)
    (spool / "impostor.json").write_bytes(impostor.to_json())

    reader = SpoolReader(spool, monotonic=Ticks(step=FULL_SCAN_EVERY_SECONDS))
    started = time.monotonic()
    scan = reader.scan()
    assert time.monotonic() - started < 5, "a FIFO or a 100 MB file must not stall the scan"
    assert scan.ok
    good = {s.engine.engine_id for _, s in scan.snapshots}
    assert good == {"good-1", "good-2"}
    reasons = {e.file_name: e.error.reason for e in scan.entries if e.error}
    assert reasons["huge.json"] is RejectReason.TOO_LARGE
    assert reasons["link.json"] is reasons["dangling.json"] is RejectReason.NOT_REGULAR_FILE
    assert reasons["dir.json"] is reasons["fifo.json"] is RejectReason.NOT_REGULAR_FILE
    assert reasons["impostor.json"] is RejectReason.DUPLICATE_ENGINE
    expected = {r.value: 0 for r in RejectReason}
    for _, reason in BAD_DOCUMENTS.values():
        expected[reason.value] += 1
    expected["too_large"] += 1
    expected["not_regular_file"] += 4
    expected["duplicate_engine"] += 1
    assert {r: reader.rejections[r] for r in expected} == expected

    reader.scan()
    assert {r: reader.rejections[r] for r in expected} == expected, "an unchanged bad file is counted once"
    (spool / "bad-00.json").write_bytes(b"{still bad")
    reader.scan()
    assert reader.rejections["invalid_json"] == expected["invalid_json"] + 1, "a changed file is read again"


class Ticks:
    """A monotonic clock that moves ``step`` seconds at every reading."""

    def __init__(self, step: float = 0.0) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_an_unchanged_settled_directory_is_not_listed_until_the_full_scan_interval(spool: Path) -> None:
    write_snapshot(spool, make_snapshot("a", max_num_seqs=1))
    ticks = Ticks()
    settled = spool.stat().st_mtime_ns + SETTLE_NS + 1
    reader = SpoolReader(spool, monotonic=ticks, wall_ns=lambda: settled)
    first = reader.scan()
    (spool / "a.json").write_bytes(make_snapshot("a", max_num_seqs=2).to_json())  # in place: the directory is unchanged
    assert reader.scan() is first, "an unchanged, settled directory is not listed again"
    ticks.now += FULL_SCAN_EVERY_SECONDS
    assert reader.scan().snapshots[0][1].settings.max_num_seqs == 2, "the periodic full scan sees it"
    write_snapshot(spool, make_snapshot("a", max_num_seqs=3))  # a writer renames: the directory changes
    assert reader.scan().snapshots[0][1].settings.max_num_seqs == 3, "a rename is seen at once"


def test_a_directory_changed_within_the_settle_margin_is_listed_every_time(spool: Path) -> None:
    write_snapshot(spool, make_snapshot("a", max_num_seqs=1))
    unsettled = spool.stat().st_mtime_ns + SETTLE_NS // 2
    reader = SpoolReader(spool, monotonic=Ticks(), wall_ns=lambda: unsettled)
    reader.scan()
    (spool / "a.json").write_bytes(make_snapshot("a", max_num_seqs=2).to_json())
    assert reader.scan().snapshots[0][1].settings.max_num_seqs == 2, "the last scan was too close to be trusted"


def test_missing_and_unlistable_spools_are_reported_not_raised(tmp_path: Path) -> None:
    assert not SpoolReader(tmp_path / "absent").scan().ok
    file_instead = tmp_path / "file"
    file_instead.write_text("")
    scan = SpoolReader(file_instead).scan()
    assert not scan.ok and scan.entries == ()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
def test_a_file_the_sidecar_user_cannot_read_is_counted_unreadable() -> None:
    spool = Path(tempfile.mkdtemp(prefix="modelkv-perm-"))
    try:
        spool.chmod(0o755)
        write_snapshot(spool, make_snapshot("readable"))
        secret = spool / "secret.json"
        secret.write_bytes(make_snapshot("secret").to_json())
        secret.chmod(0o600)
        code = (
            "import os, sys; from modelkv_exporter.sidecar.reader.scan import SpoolReader;"
            "os.setgid(65534); os.setuid(65534);"
            "r = SpoolReader(__import__('pathlib').Path(sys.argv[1])); s = r.scan();"
            "print(sorted(x.engine.engine_id for _, x in s.snapshots), dict(+r.rejections))"
        )
        result = subprocess.run(
            [sys.executable, "-c", code, str(spool)], capture_output=True, text=True, cwd=str(ROOT), check=True
        )
        assert result.stdout.strip() == "['readable'] {'unreadable': 1}"
    finally:
        shutil.rmtree(spool)


WRITER = """
import sys, time
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_testbed.snapshots import make_declaration, make_snapshot
decls = tuple(make_declaration(f"cache-{i}", capacity_source="x" * 2000) for i in range(200))
publisher = SnapshotPublisher(sys.argv[1], make_snapshot("victim", declarations=decls, interval=5.0))
publisher.write()
print("ready", flush=True)
while True:
    publisher.beat()
"""


def test_a_writer_killed_mid_write_never_produces_a_torn_read(spool: Path) -> None:
    reader = SpoolReader(spool, max_snapshot_bytes=1 << 20)  # large snapshots: a wide window to tear
    rng = random.Random(4)
    kills = 0
    deadline = time.monotonic() + 60
    while kills < 25 and time.monotonic() < deadline:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(spool)], cwd=str(ROOT), stdout=subprocess.PIPE)
        assert writer.stdout is not None and writer.stdout.readline() == b"ready\n"
        end = time.monotonic() + rng.uniform(0.0, 0.15)
        while time.monotonic() < end:
            scan = reader.scan()
            assert [e.error for e in scan.entries] == [None]
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        kills += 1
        scan = reader.scan()
        assert [s.engine.engine_id for _, s in scan.snapshots] == ["victim"]
    assert kills == 25
    assert sum(reader.rejections.values()) == 0
    leftovers = [p.name for p in spool.iterdir() if p.name.startswith(".")]
    assert all(name.endswith(".tmp") for name in leftovers), "only temp files a killed writer left behind"


def test_to_dict_has_every_field_of_every_dataclass() -> None:
    from dataclasses import asdict, fields

    from modelkv_exporter.contract.snapshot import Snapshot

    snapshot = make_snapshot(
        "e", measured={"a": 1}, baseline={"b": 2}, stage_name="s", observations=(make_observation("decoder"),)
    )
    expected = {"schema_version": snapshot.schema_version, **asdict(snapshot)}
    expected = {name: list(value) if isinstance(value, tuple) else value for name, value in expected.items()}
    assert snapshot.to_dict() == expected
    assert list(snapshot.to_dict()) == ["schema_version", *(f.name for f in fields(Snapshot))]
