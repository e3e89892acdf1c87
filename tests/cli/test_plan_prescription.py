"""`plan` prints the flag to paste for every demo engine: the KV cache memory to give vLLM, from the engine's own
figures.

Every demo engine runs in its own process as the demo runs it (real owners, transformers caches, observer,
discovery, publisher), beats once and ends; ``plan`` then prints, per engine, ``--kv-cache-memory-bytes=N``.
A demo engine is a host engine sized to ``REQUESTED_MEMORY``: N is that less its resident memory, with its
model-local caches at their peak in place of what they hold, less the margin.
"""

from __future__ import annotations

import math
import multiprocessing
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.thresholds import PRESCRIPTION_MARGIN_RATIO
from modelkv_exporter.demo.engines import DEMO_ENGINES, REQUESTED_MEMORY, run_engine
from modelkv_exporter.sidecar.capacity import Demand
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_testbed.polling import eventually


def _snapshots(spool: Path) -> dict[str, Snapshot]:
    return {snapshot.engine.engine_id: snapshot for _, snapshot in SpoolReader(spool).scan().snapshots}


def _all_beaten(spool: Path) -> bool:
    found = _snapshots(spool)
    return all(e.engine_id in found and found[e.engine_id].measured.current is not None for e in DEMO_ENGINES)


@pytest.fixture(scope="module")
def demo_spool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A spool every demo engine wrote, beat in once and marked ended."""
    spool = tmp_path_factory.mktemp("demo") / "spool"
    spool.mkdir()
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    processes = [
        context.Process(target=run_engine, args=(engine, str(spool), 0.0, stop), daemon=True) for engine in DEMO_ENGINES
    ]
    for process in processes:
        process.start()
    try:
        eventually(lambda: _all_beaten(spool), "every demo engine's first beat", timeout=240)
    finally:
        stop.set()
        for process in processes:
            process.join(60)
    yield spool


def _expected(snapshot: Snapshot) -> int:
    """The KV cache to give vLLM, from the snapshot's own figures."""
    current = snapshot.measured.current
    assert current is not None and snapshot.settings.requested_memory_bytes == REQUESTED_MEMORY
    live = sum(o.live_bytes or 0 for o in snapshot.observations)
    observed = {o.owner for o in snapshot.observations}
    live += sum(d.live_bytes for d in snapshot.discovered if d.owner not in observed)
    peak = Demand.expected(snapshot).peak_at(snapshot.settings.max_num_seqs or 1)
    needs = current.values["process_resident"] - live + max(peak, live)
    return REQUESTED_MEMORY - needs - math.ceil(REQUESTED_MEMORY * PRESCRIPTION_MARGIN_RATIO)


def test_plan_prints_the_flag_and_its_value_for_every_demo_engine(demo_spool: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", "plan", str(demo_spool), "--max-num-seqs", "8"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    snapshots = _snapshots(demo_spool)
    for engine in DEMO_ENGINES:
        (start,) = [i for i, line in enumerate(lines) if line.startswith(f"- {engine.engine_id}: ")]
        following = lines[start + 1 :]
        end = next((i for i, line in enumerate(following) if line.startswith("- ") or not line.startswith(" ")), None)
        (flag,) = [line.strip() for line in following[:end] if line.startswith("  --kv-cache-memory-bytes=")]
        value = int(re.fullmatch(r"--kv-cache-memory-bytes=(\d+)", flag).group(1))  # type: ignore[union-attr]
        assert value == _expected(snapshots[engine.engine_id]), engine.engine_id
        assert 0 < value < REQUESTED_MEMORY
