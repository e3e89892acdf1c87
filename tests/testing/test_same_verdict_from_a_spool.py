"""The same verdict from a running engine: the snapshot an observing engine publishes, read by
``modelkv-exporter check`` (sidecar side, no torch), judges an owner as the model author's check does."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.engine.observe import install
from modelkv_exporter.engine.protocol import declaring_owners
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_exporter.testing import VerdictKind, check
from tests.testing.owners import Generator, drive, spec


def test_an_engine_and_the_check_give_the_same_verdict(spool: Path) -> None:
    model = Generator([spec(physical_capacity_positions=7)])
    report = check(model, drive, max_num_seqs=2, batches=(2,))
    verdict = report.owner("").verdict
    assert verdict.kind is VerdictKind.UNDER_REPORTS

    observer = install(declaring_owners(model), enabled=True)
    try:
        model(2)
        observations = observer.sample()
    finally:
        observer.uninstall()
    snapshot = replace(build_snapshot(model, max_num_seqs=2, engine_id="generator"), observations=observations)
    write_snapshot(spool, snapshot)
    result = subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", "check", str(spool)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert f"FAIL (root) (Generator): {verdict.text}" in result.stdout, result.stdout
    assert "physical_capacity_positions=8," in result.stdout
