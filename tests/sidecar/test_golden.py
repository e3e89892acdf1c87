"""Golden spools: each folder under ``golden/`` is a spool and the exposition it must render.

A change to what /metrics says shows up as a diff of ``metrics.txt`` (text format) and
``metrics.om`` (OpenMetrics). The clock is fixed (``NOW``) and so is the collect duration.
The snapshot files are also compatibility fixtures: every sidecar must keep reading them. A `.alive` file
beside a snapshot is its liveness file, held by no process here (its engine vanished).
After an intended change, regenerate with ``MODELKV_UPDATE_GOLDEN=1 pytest tests/sidecar/test_golden.py``
and review the diff.
"""

from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path

import pytest

from modelkv_exporter.sidecar.exposition.cache import ExpositionCache
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.source import SpoolSource
from tests.support.discovered import GOLDEN_NOW, golden_discovered_spool

GOLDEN = Path(__file__).parent / "golden"
NOW = GOLDEN_NOW
UPDATE = os.environ.get("MODELKV_UPDATE_GOLDEN") == "1"
CASES = sorted(path.name for path in GOLDEN.iterdir() if path.is_dir())


def render(spool: Path, openmetrics: bool) -> str:
    source = SpoolSource(SpoolReader(spool), stale_after=30.0, clock=lambda: NOW)
    return (
        ExpositionCache(source, perf_counter=lambda: 0.0).render(openmetrics=openmetrics, compress=False).data.decode()
    )


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("expected_name,openmetrics", [("metrics.txt", False), ("metrics.om", True)])
def test_a_golden_spool_renders_its_expected_exposition(
    tmp_path: Path, case: str, expected_name: str, openmetrics: bool
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    for document in (*(GOLDEN / case).glob("*.json"), *(GOLDEN / case).glob("*.alive")):
        shutil.copyfile(document, spool / document.name)
    got = render(spool, openmetrics)
    expected_file = GOLDEN / case / expected_name
    if UPDATE:
        expected_file.write_text(got)
    expected = expected_file.read_text()
    diff = "".join(
        difflib.unified_diff(expected.splitlines(True), got.splitlines(True), str(expected_file), "rendered")
    )
    assert got == expected, f"the exposition of {case} changed:\n{diff}"


def test_every_case_has_both_expected_files() -> None:
    assert CASES, "no golden cases"
    for case in CASES:
        assert {p.name for p in (GOLDEN / case).iterdir()} >= {"metrics.txt", "metrics.om"}, case


def test_the_discovered_spool_is_what_the_contract_writes() -> None:
    """The ``discovered`` case's documents are ``Snapshot.to_dict`` output of snapshots built in
    ``tests/support/discovered.py`` (the older writer's without its two discovery fields): the golden files
    cannot drift from the contract. Regenerated with the expositions under ``MODELKV_UPDATE_GOLDEN=1``."""
    expected = golden_discovered_spool()
    if UPDATE:
        for name, data in expected.items():
            (GOLDEN / "discovered" / name).write_bytes(data)
    assert {p.name for p in (GOLDEN / "discovered").glob("*.json")} == set(expected)
    for name, data in expected.items():
        assert (GOLDEN / "discovered" / name).read_bytes() == data, name
