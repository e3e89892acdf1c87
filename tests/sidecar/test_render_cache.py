"""The render-once exposition: the same samples as prometheus_client renders, reused until the spool changes."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.collector import SpoolCollector
from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.source import SpoolSource
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.snapshots import make_declaration, make_snapshot
from tests.support.discovered import HOSTILE_OWNER, discovery_status, kv_layout, make_discovered, with_discovery

NOW = 1_800_000_000.0
MOVING = {"modelkv_exporter_collect_duration_seconds"}


def samples(text: str, openmetrics: bool = False) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for s in Exposition(text, openmetrics=openmetrics).samples
        if s.name not in MOVING
    }


def lines(text: str) -> set[str]:
    return {line for line in text.split("\n") if line and not line.startswith(("#", *MOVING))}


def fill(spool: Path) -> None:
    decls = tuple(make_declaration(f"c{i}", owner=f"m.layer{i}") for i in range(5))
    write_snapshot(
        spool,
        make_snapshot(
            "a", declarations=decls, heartbeat_at=NOW, interval=5.0, measured={"torch_reserved": 7}, baseline={}
        ),
    )
    write_snapshot(spool, make_snapshot('b\n"x\\', declarations=(), heartbeat_at=NOW - 100, interval=1.0))
    found = (make_discovered(layout=kv_layout()), make_discovered(HOSTILE_OWNER, found_by="census"))
    status = discovery_status(below_floor=2, budget_exhausted="depth")
    write_snapshot(spool, with_discovery(make_snapshot("c", heartbeat_at=NOW), found, status))
    (spool / "bad.json").write_text("[]")


def pair(spool: Path) -> tuple[SpoolCollector, ExpositionCache]:
    collector = SpoolCollector(SpoolSource(SpoolReader(spool), clock=lambda: NOW))
    return collector, ExpositionCache(collector.source)


def test_cached_bodies_have_exactly_the_collectors_samples(spool: Path) -> None:
    fill(spool)
    collector, cache = pair(spool)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    for _ in range(2):
        text = cache.render(openmetrics=False, compress=False)
        assert text.content_type.startswith("text/plain; version=0.0.4")
        assert samples(text.data.decode()) == samples(generate_latest(registry).decode())
        assert lines(text.data.decode()) == lines(generate_latest(registry).decode()), "byte for byte, line by line"
        om = cache.render(openmetrics=True, compress=False).data.decode()
        assert om.endswith("# EOF\n") and om.count("# EOF") == 1
        assert samples(om, True) == samples(generate_openmetrics(registry).decode(), True)


def test_gzip_is_one_member_that_any_inflater_reads(spool: Path) -> None:
    fill(spool)
    _, cache = pair(spool)
    for openmetrics in (False, True):
        plain = cache.render(openmetrics=openmetrics, compress=False).data
        body = cache.render(openmetrics=openmetrics, compress=True).data
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        inflated = inflater.decompress(body)
        assert inflater.eof and inflater.unused_data == b"", "a single gzip member, nothing after it"
        assert samples(inflated.decode(), openmetrics) == samples(plain.decode(), openmetrics)


def test_an_unchanged_spool_renders_no_engine_and_a_change_renders_one(spool: Path) -> None:
    fill(spool)
    _, cache = pair(spool)
    first = cache.render(openmetrics=False, compress=True).data
    assert cache.renders == 3, "three live engines (b is stale but still exported), one render each"
    cache.render(openmetrics=False, compress=True)
    assert cache.renders == 3
    write_snapshot(
        spool, make_snapshot("c", declarations=(make_declaration("new"),), heartbeat_at=NOW, measured={"x": 1})
    )
    changed = cache.render(openmetrics=False, compress=True).data
    assert cache.renders == 4
    assert 'cache="new"' in gzip.decompress(changed).decode() and 'cache="new"' not in gzip.decompress(first).decode()


def test_an_engine_going_stale_is_rendered_again(spool: Path) -> None:
    clock = [NOW]
    write_snapshot(spool, make_snapshot("a", heartbeat_at=NOW, interval=1.0))
    collector = SpoolCollector(SpoolSource(SpoolReader(spool), clock=lambda: clock[0]))
    cache = ExpositionCache(collector.source)
    assert (
        'modelkv_engine_up{engine="a",model="m",stage=""} 1.0'
        in cache.render(openmetrics=False, compress=False).data.decode()
    )
    clock[0] += 60
    text = cache.render(openmetrics=False, compress=False).data.decode()
    assert 'modelkv_engine_up{engine="a",model="m",stage=""} 0.0' in text and "modelkv_declared_peak_bytes" not in text
    assert 'modelkv_engine_snapshot_age_seconds{engine="a",model="m",stage=""} 60.0' in text


def test_many_rewrites_never_serve_an_old_version(spool: Path) -> None:
    """Object ids are reused after garbage collection; the cache must never mistake a new snapshot for an old one."""
    _, cache = pair(spool)
    for i in range(300):
        write_snapshot(spool, make_snapshot("a", max_num_seqs=1 + i % 7, heartbeat_at=NOW))
        text = cache.render(openmetrics=False, compress=i % 2 == 1).data
        text = gzip.decompress(text) if i % 2 else text
        assert f'modelkv_engine_max_num_seqs{{engine="a",model="m",stage=""}} {float(1 + i % 7)}' in text.decode()


def test_formats_never_serve_each_others_old_version(spool: Path) -> None:
    _, cache = pair(spool)
    for i in range(200):
        write_snapshot(spool, make_snapshot("a", max_num_seqs=1 + i % 5, heartbeat_at=NOW))
        openmetrics = bool(i % 3)
        text = cache.render(openmetrics=openmetrics, compress=bool(i % 2)).data
        text = gzip.decompress(text) if i % 2 else text
        assert f'modelkv_engine_max_num_seqs{{engine="a",model="m",stage=""}} {float(1 + i % 5)}' in text.decode()


def test_stored_blocks_inflate_at_every_size() -> None:
    from modelkv_exporter.sidecar.exposition.deflate import deflate_piece, stored_blocks

    for size in (0, 1, 0xFFFF, 0xFFFF + 1, 200_000):
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        stream = deflate_piece(b"head ", final=False) + stored_blocks(data)
        inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        assert inflater.decompress(stream) == b"head " + data and inflater.eof
