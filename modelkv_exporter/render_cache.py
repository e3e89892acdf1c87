"""Render /metrics once per spool change, not once per scrape.

The exposition is split in two. The *static* part holds every sample that depends only on
the snapshots and on which engines are stale: declarations, identity, settings and measured
memory. It is cached, and so is its gzip form. The *dynamic* tail holds the few families that
move with the clock or the scan: snapshot ages, spool file states, rejection counters and the
collect duration. It is rendered on every scrape.

Within the static part, each engine's sample lines are rendered once per snapshot version and
kept per family. A family's block (HELP, TYPE, and every engine's lines in file-name order) and
its gzip member are rebuilt only when one of its engines changed. A heartbeat that changes
measured memory therefore re-renders one engine's few memory lines and re-compresses a few
small blocks; the large declaration blocks stay as they were. Each block is also kept as raw
deflate data ending in a full flush (byte-aligned, no reference to earlier data), so the gzip
body is one gzip member joined from cached pieces: header, the blocks' deflate data, the tail
compressed with a final block, then the CRC-32 (extended over the tail from the static part's
cached CRC) and the size. Nothing is compressed twice.

The lines are the same as prometheus_client's encoders write for ``SpoolCollector.collect()``;
a test compares the two.
"""

from __future__ import annotations

import struct
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from modelkv_exporter.catalogue import CATALOGUE, Metric
from modelkv_exporter.collector import (
    SpoolCollector,
    engine_labels,
    engine_state,
    exporter_samples,
    snapshot_age,
)
from modelkv_exporter.snapshot import Snapshot
from modelkv_exporter.spool import SpoolEntry

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
DYNAMIC = (
    "modelkv_engine_snapshot_age_seconds",
    "modelkv_exporter_build_info",
    "modelkv_exporter_spool_scan_success",
    "modelkv_exporter_spool_files",
    "modelkv_exporter_snapshot_rejections_total",
    "modelkv_exporter_collect_duration_seconds",
)
STATIC = tuple(name for name in CATALOGUE if name not in DYNAMIC)
GZIP_LEVEL = 6
JOIN_BELOW_BYTES = 256 * 1024
"""Smaller bodies go out in one piece: a copy costs less than another send."""


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str, openmetrics: bool) -> str:
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if openmetrics else text


def sample_line(metric: Metric, values: Sequence[str], value: float) -> str:
    """One exposition line, as prometheus_client writes it in both formats (labels sorted by name)."""
    if metric.labels:
        pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(zip(metric.labels, values, strict=True)))
        return f"{metric.name}{{{pairs}}} {floatToGoString(value)}\n"
    return f"{metric.name} {floatToGoString(value)}\n"


def family_header(metric: Metric, openmetrics: bool) -> str:
    """The HELP and TYPE lines of a family."""
    if openmetrics:
        name = metric.family_name
        return f"# HELP {name} {_escape_help(metric.help, True)}\n# TYPE {name} {metric.kind}\n"
    kind = "gauge" if metric.kind == "info" else metric.kind
    return f"# HELP {metric.name} {_escape_help(metric.help, False)}\n# TYPE {metric.name} {kind}\n"


Lines = dict[str, str]


class LineSink:
    """Collects the ``add``/``info`` calls of the collector's sample functions as exposition lines, by family."""

    def __init__(self) -> None:
        self.lines: defaultdict[str, list[str]] = defaultdict(list)

    def add(self, name: str, values: list[str], value: float) -> None:
        """One sample of family ``name``."""
        self.lines[name].append(sample_line(CATALOGUE[name], values, value))

    def info(self, name: str, values: list[str]) -> None:
        """One info sample (value 1)."""
        self.add(name, values, 1.0)


def render_engine(snapshot: Snapshot, stale: bool) -> Lines:
    """An engine's static sample lines, by family."""
    sink = LineSink()
    SpoolCollector.engine_samples(snapshot, stale, sink.add, sink.info)
    return {name: "".join(chunk) for name, chunk in sink.lines.items()}


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


@dataclass
class _Block:
    """One static family as last built: the engines' lines it was joined from, its text and gzip forms."""

    holds: tuple[Lines, ...]
    text: bytes
    openmetrics: bytes
    deflated: dict[bool, bytes]


@dataclass
class _Joined:
    """The static part of one format as last joined from its blocks."""

    holds: tuple[_Block, ...]
    data: bytes
    crc: int
    deflated: bytes | None = None
    """The gzip header and every block's deflate data: the body's start when gzip is asked."""
    live_key: tuple[tuple[int, bool], ...] = ()
    pins: tuple[object, ...] = ()


GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def stored_blocks(data: bytes) -> bytes:
    """``data`` as uncompressed ("stored") deflate blocks, the last one final (RFC 1951, 3.2.4).

    The tail is a few KiB that change on every scrape; storing it costs nothing, where
    setting up a compressor costs more than the rest of the scrape.
    """
    pieces = []
    chunks = [data[i : i + 0xFFFF] for i in range(0, len(data), 0xFFFF)] or [b""]
    for i, chunk in enumerate(chunks):
        size = len(chunk)
        pieces.append(struct.pack("<BHH", 1 if i == len(chunks) - 1 else 0, size, size ^ 0xFFFF) + chunk)
    return b"".join(pieces)


def deflate_piece(data: bytes, final: bool) -> bytes:
    """Raw deflate data for ``data`` that can be followed by another piece (or ends the stream)."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush(zlib.Z_FINISH if final else zlib.Z_FULL_FLUSH)


@dataclass(frozen=True)
class Body:
    """A rendered /metrics body, in pieces a server can send without joining, and its content type."""

    parts: tuple[bytes, ...]
    content_type: str
    gzipped: bool

    @property
    def data(self) -> bytes:
        """The whole body in one piece."""
        return b"".join(self.parts)

    def __len__(self) -> int:
        return sum(map(len, self.parts))


class ExpositionCache:
    """Renders the collector's spool for /metrics, reusing everything that did not change."""

    def __init__(self, collector: SpoolCollector, clock: Callable[[], float] | None = None) -> None:
        self.collector = collector
        self.clock = clock or collector.clock
        self._lock = threading.Lock()
        self._engines: dict[tuple[int, bool], tuple[Snapshot, Lines, str]] = {}
        self._exporter_lines: tuple[object, str] = ((), "")
        self._blocks: dict[str, _Block] = {}
        self._joined: dict[bool, _Joined] = {}
        self.renders = 0

    def render(self, *, openmetrics: bool, compress: bool) -> Body:
        """The whole body for one scrape."""
        started = time.perf_counter()
        with self._lock:
            scan = self.collector.reader.scan()
            now = self.clock()
            states = {"exported": 0, "stale": 0, "ended": 0, "rejected": 0}
            live: list[tuple[SpoolEntry, bool]] = []
            for entry in scan.entries:
                if entry.snapshot is None:
                    states["rejected"] += 1
                    continue
                state = engine_state(entry.snapshot, now, self.collector.stale_after)
                states[state] += 1
                if state != "ended":
                    live.append((entry, state == "stale"))
            static = self._static(live, openmetrics, compress)
            tail = self._dynamic(live, scan.ok, states, started, openmetrics)
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        if not compress:
            if len(static.data) < JOIN_BELOW_BYTES:
                return Body((static.data + tail,), content_type, False)
            return Body((static.data, tail), content_type, False)
        assert static.deflated is not None
        trailer = struct.pack("<II", zlib.crc32(tail, static.crc), (len(static.data) + len(tail)) & 0xFFFFFFFF)
        end = stored_blocks(tail) + trailer
        if len(static.deflated) < JOIN_BELOW_BYTES:
            return Body((static.deflated + end,), content_type, True)
        return Body((static.deflated, end), content_type, True)

    def _static(self, live: list[tuple[SpoolEntry, bool]], openmetrics: bool, compress: bool) -> _Joined:
        live_key = tuple((id(entry.snapshot), stale) for entry, stale in live)
        joined = self._joined.get(openmetrics)
        if joined is not None and joined.live_key == live_key and (joined.deflated is not None or not compress):
            return joined
        # Keys are object ids; the cache holds every object it keys on, so no id is reused while cached.
        engines: dict[tuple[int, bool], tuple[Snapshot, Lines, str]] = {}
        for entry, stale in live:
            assert entry.snapshot is not None
            key = (id(entry.snapshot), stale)
            cached = self._engines.get(key)
            if cached is None:
                age = sample_line(CATALOGUE["modelkv_engine_snapshot_age_seconds"], engine_labels(entry.snapshot), 0.0)
                cached = (entry.snapshot, render_engine(entry.snapshot, stale), age[: age.rindex(" ") + 1])
                self.renders += 1
            engines[key] = cached
        self._engines = engines
        blocks = []
        for name in STATIC:
            holds = tuple(lines for _, lines, _ in engines.values() if name in lines)
            if not holds:
                self._blocks.pop(name, None)
                continue
            block = self._blocks.get(name)
            if block is None or not _same(block.holds, holds):
                text = "".join(lines[name] for lines in holds)
                metric = CATALOGUE[name]
                block = _Block(
                    holds,
                    (family_header(metric, False) + text).encode(),
                    (family_header(metric, True) + text).encode(),
                    {},
                )
                self._blocks[name] = block
            blocks.append(block)
        joined = self._joined.get(openmetrics)
        if joined is None or not _same(joined.holds, tuple(blocks)):
            data = b"".join(b.openmetrics if openmetrics else b.text for b in blocks)
            joined = _Joined(tuple(blocks), data, zlib.crc32(data))
            self._joined[openmetrics] = joined
        joined.live_key, joined.pins = live_key, tuple(entry.snapshot for entry, _ in live)
        if compress and joined.deflated is None:
            for block in blocks:
                if openmetrics not in block.deflated:
                    block.deflated[openmetrics] = deflate_piece(block.openmetrics if openmetrics else block.text, False)
            joined.deflated = GZIP_HEADER + b"".join(block.deflated[openmetrics] for block in blocks)
        return joined

    def _dynamic(
        self,
        live: list[tuple[SpoolEntry, bool]],
        scan_ok: bool,
        states: dict[str, int],
        started: float,
        openmetrics: bool,
    ) -> bytes:
        now = self.clock()
        ages = []
        for entry, stale in live:
            assert entry.snapshot is not None
            prefix = self._engines[(id(entry.snapshot), stale)][2]
            ages.append(f"{prefix}{floatToGoString(snapshot_age(entry.snapshot, now))}\n")
        text = (
            family_header(CATALOGUE["modelkv_engine_snapshot_age_seconds"], openmetrics) + "".join(ages) if ages else ""
        )
        rejections = self.collector.reader.rejections
        key = (openmetrics, scan_ok, tuple(states.values()), tuple(sorted(rejections.items())))
        if self._exporter_lines[0] != key:
            sink = LineSink()
            exporter_samples(scan_ok, states, rejections, sink.add, sink.info)
            block = "".join(
                family_header(CATALOGUE[name], openmetrics) + "".join(chunk) for name, chunk in sink.lines.items()
            )
            self._exporter_lines = (key, block)
        duration = CATALOGUE["modelkv_exporter_collect_duration_seconds"]
        text += self._exporter_lines[1] + family_header(duration, openmetrics)
        text += sample_line(duration, [], time.perf_counter() - started)
        return (text + ("# EOF\n" if openmetrics else "")).encode()
