"""A real VictoriaMetrics and vmalert (Debian's package) for the tests: processes, remote write, replay, export."""

from __future__ import annotations

import json
import struct
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx

from modelkv_testbed.processes import free_port, require_tool, serving

STALE = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
"""Prometheus's staleness marker, a NaN VictoriaMetrics keeps as such when it arrives by remote write."""
Labels = tuple[tuple[str, str], ...]
Point = tuple[int, float]
"""A sample: milliseconds since the epoch, and its value."""


@contextmanager
def running_victoria_metrics(directory: Path) -> Iterator[str]:
    """A single-node VictoriaMetrics on 127.0.0.1 keeping any age of data; yields its base URL."""
    port = free_port()
    command = [
        require_tool("victoria-metrics"),
        f"-storageDataPath={directory / 'data'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=100y",
        "-search.disableCache",
        "-search.latencyOffset=0s",
        "-loggerLevel=ERROR",
    ]
    with serving(command, port, "/health") as url:
        yield url


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _timeseries(labels: Labels, points: Iterable[Point]) -> bytes:
    body = b"".join(_field(1, _field(1, k.encode()) + _field(2, v.encode())) for k, v in labels)
    for at, value in points:
        sample = b"\x09" + struct.pack("<d", value) + b"\x10" + _varint(at & 0xFFFFFFFFFFFFFFFF)
        body += _field(2, sample)
    return body


def _snappy(data: bytes) -> bytes:
    """Snappy's block format, every byte a literal: valid, uncompressed."""
    out = bytearray(_varint(len(data)))
    for start in range(0, len(data), 65536):
        chunk = data[start : start + 65536]
        out += bytes([(len(chunk) - 1) << 2]) if len(chunk) <= 60 else b"\xf4" + struct.pack("<H", len(chunk) - 1)
        out += chunk
    return bytes(out)


def remote_write(url: str, series: dict[Labels, list[Point]]) -> None:
    """Send ``series`` (each with ``__name__`` among its labels) to ``url``'s Prometheus remote-write endpoint."""
    items = list(series.items())
    for start in range(0, len(items), 500):
        body = b"".join(_field(1, _timeseries(labels, points)) for labels, points in items[start : start + 500])
        response = httpx.post(
            url + "/api/v1/write",
            content=_snappy(body),
            headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"},
            timeout=60,
        )
        assert response.status_code in (200, 204), response.text


def flush(url: str) -> None:
    """Make everything written so far searchable."""
    assert httpx.get(url + "/internal/force_flush", timeout=60).status_code == 200


def rfc3339(seconds: float) -> str:
    """``seconds`` since the epoch as vmalert's replay flags spell a time."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def replay(rules: Path, url: str, start: float, end: float) -> subprocess.Popen[bytes]:
    """Start vmalert replaying ``rules`` from ``start`` to ``end`` over ``url``, writing back to it, with no pause
    between rules: a rule it replays reads no other's results (``simulation.on_victoria.stages``)."""
    return subprocess.Popen(
        [
            require_tool("vmalert"),
            f"-rule={rules}",
            f"-datasource.url={url}",
            f"-remoteWrite.url={url}",
            "-remoteWrite.flushInterval=10ms",
            f"-replay.timeFrom={rfc3339(start)}",
            f"-replay.timeTo={rfc3339(end)}",
            "-replay.rulesDelay=0s",
            "-replay.disableProgressBar",
            "-evaluationInterval=1m",
            "-datasource.queryStep=1m",
            "-loggerLevel=ERROR",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def export(url: str, match: str, start: float, end: float) -> dict[Labels, list[Point]]:
    """Every raw sample of the series ``match`` selects between ``start`` and ``end`` (seconds)."""
    response = httpx.post(
        url + "/api/v1/export", data={"match[]": match, "start": str(start), "end": str(end)}, timeout=60
    )
    assert response.status_code == 200, response.text
    found: dict[Labels, list[Point]] = {}
    for line in response.text.splitlines():
        row = json.loads(line)
        labels = tuple(sorted(row["metric"].items()))
        found[labels] = sorted(zip(row["timestamps"], row["values"], strict=True))
    return found


def query(url: str, promql: str, at: float) -> list[dict]:
    """An instant query at ``at``; fails the test on an error response."""
    response = httpx.get(url + "/api/v1/query", params={"query": promql, "time": str(at)}, timeout=60)
    assert response.status_code == 200, f"{promql}: {response.text}"
    result: list[dict] = response.json()["data"]["result"]
    return result
