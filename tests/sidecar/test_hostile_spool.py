"""What a hostile spool shows HTTP clients: never a 500, nothing invisible or reordering, no path, no OS error.

The real sidecar process over spools that hold a file name that is not UTF-8 (finding 5),
bidi overrides, NUL and ESC in every text field (finding 9), unreadable files and a spool
that goes away (finding 11), and many small files (finding 6, at a quick size here).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.processes import Sidecar, start_sidecar, stop_process
from modelkv_testbed.snapshots import make_declaration, make_snapshot
from modelkv_testbed.worst_spool import write_worst_spool

SPOOF = "ad\u202emin\u2066x\u0000y\u001b[31mred\u200bz"
INVISIBLE = ("\u202e", "\u2066", "\u0000", "\u001b", "\u200b")
ROUTES = ("/", "/api/v1/engines", "/metrics", "/readyz", "/healthz")


def everything(sidecar: Sidecar) -> dict[str, httpx.Response]:
    return {path: sidecar.get(path) for path in ROUTES}


def test_a_file_name_that_is_not_utf8_is_shown_escaped(sidecar: Sidecar) -> None:
    write_snapshot(sidecar.spool_dir, make_snapshot("good"))
    with open(os.fsencode(sidecar.spool_dir) + b"/rej\xff.json", "wb") as handle:
        handle.write(b"{")
    responses = everything(sidecar)
    assert {path: r.status_code for path, r in responses.items()} == dict.fromkeys(ROUTES, 200)
    (rejected,) = responses["/api/v1/engines"].json()["rejected"]
    assert rejected["file"] == "rej\\xff.json" and rejected["reason"] == "invalid_json"
    assert "rej\\xff.json" in responses["/"].text


def test_invisible_characters_never_reach_a_page_or_the_json_raw(sidecar: Sidecar) -> None:
    declaration = make_declaration(SPOOF, owner=SPOOF, capacity_source=SPOOF)
    write_snapshot(
        sidecar.spool_dir, make_snapshot(SPOOF, declarations=(declaration,), served_model_name=SPOOF, stage_name=SPOOF)
    )
    page = sidecar.get("/")
    api = sidecar.get("/api/v1/engines")
    for response in (page, api, sidecar.get("/metrics")):
        assert response.status_code == 200
        assert response.headers["x-content-type-options"] == "nosniff"
        for ch in INVISIBLE:
            assert ch not in response.text, (response.url, repr(ch))
    assert "ad\\u202emin\\u2066x\\x00y\\x1b[31mred\\u200bz" in page.text, "shown as visible escapes"
    (engine,) = api.json()["engines"]
    assert engine["snapshot"]["engine"]["engine_id"] == SPOOF, "the JSON escapes them losslessly"
    assert b"\\u202e" in api.content and b"\xe2\x80\xae" not in api.content


def test_no_path_or_os_error_reaches_a_client(tmp_path: Path) -> None:
    spool = tmp_path / "secret-place" / "spool"
    spool.mkdir(parents=True)
    write_snapshot(spool, make_snapshot("good"))
    (spool / "locked.json").write_bytes(make_snapshot("locked").to_json())
    (spool / "locked.json").chmod(0)
    running = start_sidecar(spool, "--log-level", "info")
    try:
        readable = everything(running)
        spool.rename(tmp_path / "moved")
        gone = everything(running)
    finally:
        stop_process(running.process)
    assert gone["/readyz"].status_code == 503 and gone["/"].status_code == 200
    for response in [*readable.values(), *gone.values()]:
        assert str(tmp_path) not in response.text, response.url
        for os_text in ("No such file", "Permission denied", "Errno"):
            assert os_text not in response.text, (response.url, os_text)
    if os.geteuid() != 0:  # root reads a file of mode 0
        assert "could not be read" in readable["/"].text
        assert "Permission denied" in running.output(), "the log keeps the OS error"
    assert "cannot list the spool" in running.output() and str(tmp_path) in running.output(), "the log keeps it"


def test_many_small_files_are_counted_not_all_read(spool: Path) -> None:
    for i in range(2000):
        (spool / f"f{i:05}.json").write_bytes(make_snapshot(f"e{i:05}", declarations=()).to_json())
    running = start_sidecar(spool, "--max-spool-files", "100")
    try:
        exposition = Exposition(running.get("/metrics").text)
        assert len(exposition.all("modelkv_engine_up")) == 100
        assert exposition.value("modelkv_exporter_spool_files", state="rejected") == 1900
        assert exposition.value("modelkv_exporter_snapshot_rejections_total", reason="over_budget") == 1900
        assert httpx.get(running.probe_url + "/healthz").status_code == 200
        document = running.get("/api/v1/engines").json()
        assert document["unread_files"] == 1900 and len(document["engines"]) == 100
        assert json.dumps(document).count("f0") == 100
    finally:
        stop_process(running.process)


RSS_BOUND_MIB = 160
"""The documented bound (docs/reliability.md): the worst admitted spool, every form of every page."""


def test_the_worst_admitted_spool_stays_under_the_memory_bound(spool: Path) -> None:
    worst = write_worst_spool(spool)
    running = start_sidecar(spool)
    try:
        forms = ({}, {"Accept-Encoding": "gzip"}, {"Accept": "application/openmetrics-text"})
        for headers in forms:
            assert running.get("/metrics", headers=headers).status_code == 200
        for path in ("/", "/api/v1/engines"):
            assert running.get(path).status_code == 200
        exposition = Exposition(running.get("/metrics").text)
        assert len(exposition.all("modelkv_engine_up")) == len(worst.engines), "every engine exported"
        status = Path(f"/proc/{running.process.pid}/status").read_text()
        peak_mib = int(status.split("VmHWM:")[1].split()[0]) / 1024
        print(
            f"\nworst admitted spool ({worst.series} series, {len(worst.engines)} engines): peak RSS {peak_mib:.0f} MiB"
        )
        assert peak_mib < RSS_BOUND_MIB
    finally:
        stop_process(running.process)
