"""Render /metrics once per spool change, not once per scrape.

The exposition is split in two. The *static* part holds every sample that depends only on
the snapshots and on which engines are stale: declarations, identity, settings and measured
memory. It is cached, and so is its gzip form. The *dynamic* tail holds the few families that
move with the clock or the scan: snapshot ages, spool file states, rejection counters and the
collect duration. It is rendered on every scrape.

Everything cached is keyed by values, never by object identity: an engine by its file name,
the file's version (``SpoolEntry.version``, new for every read of a changed file) and its
state; a family's block by the keys of the engines it holds; the joined static part by
its blocks' keys; the exporter's own families by the scan's outcome, the state counts and the
rejection counts.

Within the static part, each engine's sample lines are rendered once per key and kept per
family. A family's block (HELP, TYPE, and every engine's lines in file-name order) and its
deflate piece are rebuilt only when one of its engines changed. A heartbeat that changes
measured memory therefore re-renders one engine's lines and re-compresses a few small blocks;
the large declaration blocks stay as they were.

The lines are the same as prometheus_client's encoders write for ``SpoolCollector.collect()``;
a test compares the two.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client.utils import floatToGoString

from modelkv_exporter.sidecar.catalogue import CATALOGUE
from modelkv_exporter.sidecar.exposition.deflate import GZIP_HEADER, deflate_piece, gzip_trailer, stored_blocks
from modelkv_exporter.sidecar.exposition.lines import LineSink, family_header, sample_line
from modelkv_exporter.sidecar.exposition.negotiation import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE
from modelkv_exporter.sidecar.labels import engine_labels
from modelkv_exporter.sidecar.reader.scan import SpoolEntry
from modelkv_exporter.sidecar.reader.state import LIVE_STATES, EngineState, SpoolView, snapshot_age
from modelkv_exporter.sidecar.samples import exporter_samples, refusal_samples, shown_samples
from modelkv_exporter.sidecar.source import SpoolSource

DYNAMIC = (
    "modelkv_engine_snapshot_age_seconds",
    "modelkv_exporter_build_info",
    "modelkv_exporter_spool_scan_success",
    "modelkv_exporter_spool_files",
    "modelkv_exporter_snapshot_rejections_total",
    "modelkv_exporter_collect_duration_seconds",
    "modelkv_exporter_http_refusals_total",
)
STATIC = tuple(name for name in CATALOGUE if name not in DYNAMIC)
JOIN_BELOW_BYTES = 256 * 1024
"""Smaller bodies go out in one piece: a copy costs less than another send."""

EngineKey = tuple[str, int, EngineState]
"""An engine's file name, the file's version, and its state (exported, stale, vanished or ended)."""


@dataclass(frozen=True)
class _EngineLines:
    """One engine's static lines by family, and the start of its snapshot-age line."""

    lines: dict[str, str]
    age_prefix: str


@dataclass
class _Block:
    """One static family as last built from the lines of the engines in ``key``."""

    key: tuple[EngineKey, ...]
    text: bytes
    openmetrics: bytes
    deflated: dict[bool, bytes] = field(default_factory=dict)


@dataclass
class _Joined:
    """The static part of one format: its blocks' data joined, their CRC, and the gzip start when asked."""

    key: tuple[tuple[str, tuple[EngineKey, ...]], ...]
    live: tuple[EngineKey, ...]
    data: bytes
    crc: int
    deflated: bytes | None = None


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
    """Renders the spool for /metrics, reusing everything that did not change."""

    def __init__(
        self,
        source: SpoolSource,
        perf_counter: Callable[[], float] = time.perf_counter,
        refusals: Mapping[str, int] | None = None,
    ) -> None:
        self.source = source
        self.perf_counter = perf_counter
        self.refusals = refusals
        """The HTTP server's refusal counts, exported when given (a server serves this cache)."""
        self._lock = threading.Lock()
        self._engines: dict[EngineKey, _EngineLines] = {}
        self._exporter_lines: tuple[object, str] = ((), "")
        self._blocks: dict[str, _Block] = {}
        self._joined: dict[bool, _Joined] = {}
        self._headers = {
            openmetrics: {name: family_header(metric, openmetrics) for name, metric in CATALOGUE.items()}
            for openmetrics in (False, True)
        }
        self.renders = 0
        """Engine renders so far: how often an engine's lines were built (for tests and benchmarks)."""

    @staticmethod
    def _engine_key(entry: SpoolEntry, state: EngineState) -> EngineKey:
        """What an engine's static lines depend on."""
        return (entry.file_name, entry.version, state)

    def _exporter_key(self, view: SpoolView, openmetrics: bool) -> tuple[object, ...]:
        """What the exporter's own families depend on: format, scan outcome, file states, rejection counts."""
        rejections = tuple(sorted(self.source.reader.rejections.items()))
        return (openmetrics, view.scan.ok, tuple(view.counts.values()), rejections)

    def render(self, *, openmetrics: bool, compress: bool) -> Body:
        """The whole body for one scrape."""
        started = self.perf_counter()
        with self._lock:
            view = self.source.view()
            live = [(item.entry, item.state) for item in view.shown]
            static = self._static(live, openmetrics, compress)
            tail = self._dynamic(live, view, started, openmetrics)
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        if not compress:
            if len(static.data) < JOIN_BELOW_BYTES:
                return Body((static.data + tail,), content_type, False)
            return Body((static.data, tail), content_type, False)
        assert static.deflated is not None
        end = stored_blocks(tail) + gzip_trailer(zlib.crc32(tail, static.crc), len(static.data) + len(tail))
        if len(static.deflated) < JOIN_BELOW_BYTES:
            return Body((static.deflated + end,), content_type, True)
        return Body((static.deflated, end), content_type, True)

    def _static(self, live: list[tuple[SpoolEntry, EngineState]], openmetrics: bool, compress: bool) -> _Joined:
        keys = tuple(self._engine_key(entry, state) for entry, state in live)
        joined = self._joined.get(openmetrics)
        if joined is not None and joined.live == keys and (joined.deflated is not None or not compress):
            return joined
        engines = {key: self._engine_lines(key, entry, state) for key, (entry, state) in zip(keys, live, strict=True)}
        self._engines = engines
        named = [(name, block) for name in STATIC if (block := self._block(name, engines)) is not None]
        blocks = [block for _, block in named]
        joined_key = tuple((name, block.key) for name, block in named)
        if joined is None or joined.key != joined_key:
            data = b"".join(b.openmetrics if openmetrics else b.text for b in blocks)
            joined = _Joined(joined_key, keys, data, zlib.crc32(data))
            self._joined[openmetrics] = joined
        joined.live = keys
        if compress and joined.deflated is None:
            for block in blocks:
                if openmetrics not in block.deflated:
                    block.deflated[openmetrics] = deflate_piece(block.openmetrics if openmetrics else block.text, False)
            joined.deflated = GZIP_HEADER + b"".join(block.deflated[openmetrics] for block in blocks)
        return joined

    def _engine_lines(self, key: EngineKey, entry: SpoolEntry, state: EngineState) -> _EngineLines:
        cached = self._engines.get(key)
        if cached is not None:
            return cached
        assert entry.snapshot is not None
        sink = LineSink()
        shown_samples(entry.snapshot, state, sink.add, sink.info, self.source.budget.sidecar_max_discovered_owners)
        age = sample_line(CATALOGUE["modelkv_engine_snapshot_age_seconds"], engine_labels(entry.snapshot), 0.0)
        self.renders += 1
        return _EngineLines(sink.joined(), age[: age.rindex(" ") + 1])

    def _block(self, name: str, engines: dict[EngineKey, _EngineLines]) -> _Block | None:
        key = tuple(engine for engine, lines in engines.items() if name in lines.lines)
        if not key:
            self._blocks.pop(name, None)
            return None
        block = self._blocks.get(name)
        if block is None or block.key != key:
            text = "".join(engines[engine].lines[name] for engine in key)
            metric = CATALOGUE[name]
            block = _Block(
                key, (family_header(metric, False) + text).encode(), (family_header(metric, True) + text).encode()
            )
            self._blocks[name] = block
        return block

    def _dynamic(
        self, live: list[tuple[SpoolEntry, EngineState]], view: SpoolView, started: float, openmetrics: bool
    ) -> bytes:
        ages = []
        for entry, state in live:
            assert entry.snapshot is not None
            if state not in LIVE_STATES:
                continue
            prefix = self._engines[self._engine_key(entry, state)].age_prefix
            ages.append(f"{prefix}{floatToGoString(snapshot_age(entry.snapshot, view.now))}\n")
        headers = self._headers[openmetrics]
        text = headers["modelkv_engine_snapshot_age_seconds"] + "".join(ages) if ages else ""
        key = self._exporter_key(view, openmetrics)
        if self._exporter_lines[0] != key:
            sink = LineSink()
            exporter_samples(view.scan.ok, view.counts, self.source.reader.rejections, sink.add, sink.info)
            block = "".join(headers[name] + "".join(chunk) for name, chunk in sink.lines.items())
            self._exporter_lines = (key, block)
        duration = "modelkv_exporter_collect_duration_seconds"
        text += self._exporter_lines[1] + headers[duration]
        text += f"{duration} {floatToGoString(self.perf_counter() - started)}\n"
        if self.refusals is not None:
            sink = LineSink()
            refusal_samples(self.refusals, sink.add)
            text += "".join(headers[name] + "".join(chunk) for name, chunk in sink.lines.items())
        return (text + ("# EOF\n" if openmetrics else "")).encode()
