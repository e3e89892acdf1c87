"""Content negotiation honours refusals (RFC 9110, 12.5): what each header gets, unit by unit and over HTTP."""

from __future__ import annotations

import httpx
import pytest

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.exposition.negotiation import MAX_ITEMS, choose_encoding, wants_openmetrics
from modelkv_testbed.processes import Sidecar
from modelkv_testbed.snapshots import make_snapshot

PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
    "text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)
PROMETHEUS_2 = "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"

ENCODINGS = {
    None: "identity",
    "": "identity",
    "gzip": "gzip",
    "x-gzip": "gzip",
    "*": "gzip",
    "deflate, br": "identity",
    "gzip;q=0": "identity",
    "gzip;level=1;q=0": "identity",
    "gzip; Q = 0": "identity",
    "gzip;q=0,gzip;q=1": "identity",
    "gzip;q=1,gzip;q=0": "identity",
    "gzip;q=0.5, identity": "identity",
    "gzip, identity;q=0.5": "gzip",
    "gzip;q=nonsense": "identity",
    "identity;q=0": None,
    "*;q=0": None,
    "identity;q=0, *": "gzip",
    "*;q=0, gzip": "gzip",
    "*;q=0, identity": "identity",
}

MEDIA = {
    None: False,
    "*/*": False,
    "text/plain": False,
    PROMETHEUS_3: True,
    PROMETHEUS_2: True,
    "application/openmetrics-text": True,
    "application/openmetrics-text;q=0": False,
    "application/openmetrics-text;q=0.5, application/openmetrics-text;q=0": False,
    "application/openmetrics-text;q=0.2, text/plain;q=0.9": False,
    "text/plain;q=0, application/openmetrics-text;q=0.1": True,
    "text/html,application/xhtml+xml,*/*;q=0.8": False,
}


@pytest.mark.parametrize("header", list(ENCODINGS), ids=[repr(h) for h in ENCODINGS])
def test_accept_encoding(header: str | None) -> None:
    assert choose_encoding(header) == ENCODINGS[header]


@pytest.mark.parametrize("header", list(MEDIA), ids=[repr(h)[:60] for h in MEDIA])
def test_accept(header: str | None) -> None:
    assert wants_openmetrics(header) is MEDIA[header]


def test_only_the_first_items_are_read() -> None:
    assert choose_encoding("deflate, " * MAX_ITEMS + "gzip") == "identity", "an item past MAX_ITEMS is not read"
    assert choose_encoding("deflate, " * (MAX_ITEMS - 1) + "gzip") == "gzip"


def test_over_http_refusals_are_honoured(sidecar: Sidecar) -> None:
    write_snapshot(sidecar.spool_dir, make_snapshot("e"))
    for header, expected in ENCODINGS.items():
        if header is None:
            continue  # httpx always sends one
        with httpx.stream("GET", sidecar.url + "/metrics", headers={"Accept-Encoding": header}) as response:
            if expected is None:
                assert response.status_code == 406, header
                continue
            assert response.status_code == 200, header
            assert response.headers.get("content-encoding", "identity") == expected, header
    om = sidecar.get("/metrics", headers={"Accept": "application/openmetrics-text;q=0"})
    assert om.headers["content-type"].startswith("text/plain; version=0.0.4")
    om = sidecar.get("/metrics", headers={"Accept": PROMETHEUS_3})
    assert om.headers["content-type"].startswith("application/openmetrics-text") and om.text.endswith("# EOF\n")
