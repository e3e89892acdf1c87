"""The real sidecar process on 127.0.0.1: endpoints, negotiation, read-only, promtool, real Prometheus."""

from __future__ import annotations

import gzip
import json
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from modelkv_exporter.contract.snapshot import SCHEMA_VERSION
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.polling import eventually
from modelkv_testbed.processes import Sidecar, require_tool, start_sidecar, stop_process
from modelkv_testbed.prometheus import query, running_prometheus, scrape_config
from modelkv_testbed.snapshots import make_declaration, make_observation, make_snapshot
from tests.contract.test_spool import BAD_DOCUMENTS
from tests.support.discovered import CENSUS, discovery_status, make_discovered, with_discovery


def peaks(text: str) -> dict[str, float]:
    return {
        s.labels["engine"] + "/" + s.labels["cache"]: s.value
        for s in Exposition(text).all("modelkv_declared_peak_bytes")
    }


def test_metrics_text_openmetrics_and_gzip(sidecar: Sidecar) -> None:
    write_snapshot(sidecar.spool_dir, make_snapshot("e"))
    plain = sidecar.get("/metrics")
    assert plain.status_code == 200 and plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert peaks(plain.text) == {"e/cache": make_declaration().peak_bytes}

    om = sidecar.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")
    names = Exposition(om.text, openmetrics=True).names()
    assert {"modelkv_declared_peak_bytes", "modelkv_declaration", "modelkv_exporter_snapshot_rejections"} <= names

    raw = httpx.get(sidecar.url + "/metrics", headers={"Accept-Encoding": "gzip"}, timeout=10)
    assert raw.headers["content-encoding"] == "gzip" and "Accept-Encoding" in raw.headers["vary"]
    assert peaks(raw.text) == peaks(plain.text)
    with httpx.stream("GET", sidecar.url + "/metrics", headers={"Accept-Encoding": "gzip"}) as response:
        body = b"".join(response.iter_raw())
    assert gzip.decompress(body).decode().startswith("# HELP")
    refused = httpx.get(sidecar.url + "/metrics", headers={"Accept-Encoding": "gzip;q=0, identity"})
    assert "content-encoding" not in refused.headers


def test_routes_are_explicit_read_only_and_never_redirect(sidecar: Sidecar) -> None:
    assert sidecar.get("/metrics/", follow_redirects=False).status_code == 404
    assert sidecar.get("/healthz").text == "ok\n"
    assert sidecar.get("/readyz").status_code == 200
    before = sorted(p.name for p in sidecar.spool_dir.iterdir())
    for path in ("/", "/metrics", "/healthz", "/readyz", "/api/v1/engines"):
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            assert httpx.request(method, sidecar.url + path, content=b"{}").status_code == 405, (method, path)
    assert sidecar.get("/docs").status_code == 404, "no page that pulls external assets"
    assert sorted(p.name for p in sidecar.spool_dir.iterdir()) == before


def test_readyz_fails_when_the_spool_goes_away(tmp_path: Path) -> None:
    from modelkv_testbed.processes import start_sidecar

    spool = tmp_path / "gone"
    spool.mkdir()
    running = start_sidecar(spool)
    try:
        spool.rmdir()
        assert running.get("/readyz").status_code == 503
        metrics = running.get("/metrics")
        assert metrics.status_code == 200 and "modelkv_exporter_spool_scan_success 0.0" in metrics.text
    finally:
        stop_process(running.process)


def test_bad_spool_input_never_fails_a_request(sidecar: Sidecar) -> None:
    write_snapshot(sidecar.spool_dir, make_snapshot("good"))
    for i, (data, _) in enumerate(BAD_DOCUMENTS.values()):
        (sidecar.spool_dir / f"bad-{i}.json").write_bytes(data)
    with open(sidecar.spool_dir / "huge.json", "wb") as handle:
        handle.truncate(100 * 1024 * 1024)
    nasty = make_declaration('q"\n\\', capacity_source="\ud800 \x00 漢字 " * 100)
    write_snapshot(sidecar.spool_dir, make_snapshot('nasty\n"', declarations=(nasty,)))
    for _ in range(3):
        response = sidecar.get("/metrics")
        assert response.status_code == 200
        assert set(peaks(response.text)) == {"good/cache", 'nasty "/q" \\'}
    rejected = sidecar.get("/api/v1/engines").json()["rejected"]
    assert len(rejected) == len(BAD_DOCUMENTS) + 1 and all(r["reason"] and r["detail"] for r in rejected)
    counted = Exposition(sidecar.get("/metrics").text).by("modelkv_exporter_snapshot_rejections_total", "reason")
    assert counted["too_large"] == 1 and sum(counted.values()) == len(BAD_DOCUMENTS) + 1


def test_engines_api_returns_the_snapshots(sidecar: Sidecar) -> None:
    snapshot = make_snapshot("e", stage_name="talker")
    write_snapshot(sidecar.spool_dir, snapshot)
    body = sidecar.get("/api/v1/engines").json()
    assert body["spool_error"] is None and body["schema_version"] == SCHEMA_VERSION
    (engine,) = body["engines"]
    assert engine["state"] == "exported"
    assert engine["snapshot"] == json.loads(snapshot.to_json())


def test_engines_api_gives_each_engine_the_parts_metrics_exports(sidecar: Sidecar) -> None:
    """An engine with a process figure carries its breakdown, the same bytes as /metrics's parts and to the byte
    the figure they split; an engine without a sample has none (the document only grows)."""
    mib = 1024**2
    measured = make_snapshot(
        "host",
        declarations=(make_declaration("kv", owner="talker"),),
        measured={"process_resident": 900 * mib},
        observations=(make_observation("talker", peak_bytes=40 * mib, live_bytes=30 * mib),),
    )
    measured = replace(measured, settings=replace(measured.settings, weights_bytes=300 * mib, runtime_bytes=500 * mib))
    write_snapshot(sidecar.spool_dir, measured)
    write_snapshot(sidecar.spool_dir, make_snapshot("unsampled"))
    body = sidecar.get("/api/v1/engines").json()
    engines = {e["snapshot"]["engine"]["engine_id"]: e for e in body["engines"]}
    exported = Exposition(sidecar.get("/metrics").text)
    parts = {s.labels["component"]: s.value for s in exported.all("modelkv_memory_breakdown_bytes")}
    document = engines["host"]["memory_breakdown"]
    assert document["of"] == "process_resident" and document["bytes"] == 900 * mib
    assert document["parts"] == parts and parts["weights"] == 300 * mib and parts["model_local_caches"] == 30 * mib
    assert parts["runtime"] == 500 * mib and parts["unexplained"] == 70 * mib, "complete: the rest is there"
    assert "memory_breakdown" not in engines["unsampled"]


def test_engines_api_lists_discovered_owners_and_what_metrics_left_out(spool: Path) -> None:
    """The whole snapshot, every discovered owner included, plus how many of them /metrics leaves out past
    --sidecar-max-discovered-owners; an engine whose writer does not report discovery has no such field."""
    found = tuple(make_discovered(f"m.layers.{i}", found_by=CENSUS, peak_bytes=(i + 1) << 20) for i in range(5))
    snapshot = with_discovery(make_snapshot("e", stage_name="talker"), found, discovery_status())
    write_snapshot(spool, snapshot)
    write_snapshot(spool, make_snapshot("older"))
    sidecar = start_sidecar(spool, "--sidecar-max-discovered-owners", "3")
    try:
        body = sidecar.get("/api/v1/engines").json()
        exposition = Exposition(sidecar.get("/metrics").text)
    finally:
        stop_process(sidecar.process)
    engines = {engine["snapshot"]["engine"]["engine_id"]: engine for engine in body["engines"]}
    assert engines["e"]["snapshot"] == json.loads(snapshot.to_json())
    assert [d["owner"] for d in engines["e"]["snapshot"]["discovered"]] == [f"m.layers.{i}" for i in range(5)]
    assert engines["e"]["discovered_owners_omitted"] == 2
    assert set(engines["e"]) == {"file", "state", "snapshot", "discovered_owners_omitted", "prescription"}
    assert set(engines["older"]) == {"file", "state", "snapshot", "prescription"}, "the document's shape only grows"
    assert engines["older"]["prescription"]["kv_cache_memory_bytes"] is None, "no requested memory: absent, never 0"
    assert engines["older"]["prescription"]["reason"].startswith("no total memory")
    assert set(exposition.by("modelkv_discovered_peak_bytes", "owner")) == {"m.layers.2", "m.layers.3", "m.layers.4"}
    assert exposition.value("modelkv_discovery_owners_omitted", reason="exporter_budget") == 2


def test_promtool_accepts_the_exposition(sidecar: Sidecar) -> None:
    promtool = require_tool("promtool")
    decls = (
        make_declaration("a"),
        make_declaration("b", rows="fixed", rows_fixed=2, scope="model", capacity_source='x"\n'),
    )
    write_snapshot(
        sidecar.spool_dir,
        make_snapshot("e1", declarations=decls, measured={"process_resident": 1}, baseline={"process_resident": 1}),
    )
    write_snapshot(sidecar.spool_dir, make_snapshot("e2", declarations=()))
    (sidecar.spool_dir / "bad.json").write_text("{")
    text = sidecar.get("/metrics").text
    openmetrics = sidecar.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}).text
    assert "# UNIT " in openmetrics and "# UNIT " not in text, "UNIT lines belong to OpenMetrics only"
    # promtool check metrics reads the text format only (it refuses OpenMetrics' info type).
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_openmetrics_states_the_unit_of_every_bytes_and_seconds_family(sidecar: Sidecar) -> None:
    """prometheus_client's OpenMetrics parser reads a unit for each ``_bytes`` and ``_seconds`` family.

    The parser refuses a unit the family's name does not end with, and the text format (0.0.4)
    has no UNIT line: its parser reads every family without one.
    """
    write_snapshot(
        sidecar.spool_dir,
        make_snapshot("e", measured={"process_resident": 1 << 30}, baseline={"process_resident": 1 << 29}),
    )
    accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
    units = {
        family.name: family.unit
        for family in Exposition(sidecar.get("/metrics", headers=accept).text, openmetrics=True)
    }
    expected = {name: name.rsplit("_", 1)[1] if name.endswith(("_bytes", "_seconds")) else "" for name in units}
    assert units == expected
    assert {unit for unit in units.values()} == {"bytes", "seconds", ""}
    assert {"modelkv_memory_process_resident_bytes", "modelkv_exporter_collect_duration_seconds"} <= set(units)
    assert {family.unit for family in Exposition(sidecar.get("/metrics").text)} == {""}


@pytest.fixture
def prometheus(sidecar: Sidecar, tmp_path: Path) -> Iterator[str]:
    config = scrape_config({"modelkv": sidecar.url})
    with running_prometheus(tmp_path, config) as url:
        yield url


def test_a_real_prometheus_scrapes_the_declared_values(sidecar: Sidecar, prometheus: str) -> None:
    per_seq = make_declaration("req", max_num_seqs=16)
    pool = make_declaration("pool", rows="fixed", rows_fixed=3, scope="model", max_num_seqs=16)
    write_snapshot(
        sidecar.spool_dir,
        make_snapshot("stage-1", declarations=(per_seq, pool), max_num_seqs=16, stage_name="code2wav"),
    )
    result = eventually(
        lambda: len(found := query(prometheus, 'modelkv_declared_peak_bytes{job="modelkv"}')) == 2 and found,
        "both declarations in Prometheus",
    )
    got = {r["metric"]["cache"]: float(r["value"][1]) for r in result}
    assert got == {"req": per_seq.bytes_per_row * 16, "pool": pool.bytes_per_row * 3}
    assert all(r["metric"]["stage"] == "code2wav" and r["metric"]["rows"] for r in result)
    (up,) = query(prometheus, 'up{job="modelkv"}')
    assert up["value"][1] == "1"
    (total,) = query(prometheus, "sum by (engine) (modelkv_declared_peak_bytes)")
    assert float(total["value"][1]) == per_seq.peak_bytes + pool.peak_bytes
