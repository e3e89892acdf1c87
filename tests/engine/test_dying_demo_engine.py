"""Issue 49's demo engine: its model's streaming cache leaks a page a step until the model raises a real
``torch.OutOfMemoryError``; the engine's snapshot ends ``out_of_memory`` with the growth and the leaking cache."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.spool import alive_file_name, snapshot_file_name, writer_alive
from modelkv_exporter.demo import owners
from modelkv_exporter.demo.engines import DEMO_ENGINES, DYING_ENGINE, build_model, run_engine
from modelkv_exporter.sidecar.reader.scan import read_snapshot_file
from modelkv_testbed.polling import eventually

PAGE = owners.StreamingAudioKVCache.LAYERS * 2 * owners.StreamingAudioKVCache.PAGE * 1024 * 2
"""Bytes of one page of the streaming cache (bfloat16), computed apart from the code under test."""


def test_the_leaking_cache_raises_a_real_out_of_memory_once_its_pretend_device_is_full() -> None:
    (leaking,) = [m for m in build_model(DYING_ENGINE).modules() if isinstance(m, owners.LeakingStreamingKVCache)]
    leaking.allocate(DYING_ENGINE.max_num_seqs)
    grown = []
    with pytest.raises(torch.OutOfMemoryError) as caught:
        for _ in range(20):
            leaking.step()
            grown.append(leaking.held_bytes())
    assert grown == [PAGE * pages for pages in range(4, owners.LeakingStreamingKVCache.DEVICE_PAGES + 1)]
    assert "Tried to allocate 23.44 MiB" in str(caught.value)
    assert DYING_ENGINE not in DEMO_ENGINES and DYING_ENGINE.dies and not any(e.dies for e in DEMO_ENGINES)


def test_the_dying_demo_engine_leaves_its_post_mortem_and_its_process_stays_until_stopped(spool: Path) -> None:
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    process = context.Process(target=run_engine, args=(DYING_ENGINE, str(spool), 0.2, stop), daemon=True)
    process.start()
    path = spool / snapshot_file_name(DYING_ENGINE.engine_id)
    try:

        def ended() -> Snapshot | None:
            snapshot = read_snapshot_file(path, 1 << 24) if path.exists() else None
            return snapshot if snapshot is not None and snapshot.ended else None

        snapshot = eventually(ended, "the dying engine's ending", timeout=180)
        end = snapshot.end
        assert end is not None and end.reason == "out_of_memory"
        assert end.error.startswith("torch.OutOfMemoryError: Tried to allocate 23.44 MiB"), end.error
        current, baseline = snapshot.measured.current, snapshot.measured.baseline
        assert current is not None and baseline is not None
        leaked = (owners.LeakingStreamingKVCache.DEVICE_PAGES - 3) * PAGE
        grown = current.values["process_resident"] - baseline.values["process_resident"]
        assert grown >= 0.9 * (3 * PAGE + leaked), f"the cache and its leak show in the ending sample: {grown}"
        assert process.is_alive(), "the process stays, as a server whose engine died does"
        alive = spool / alive_file_name(DYING_ENGINE.engine_id)
        eventually(lambda: writer_alive(alive) is False, "the ending to let go (right after its write)", timeout=10)
    finally:
        stop.set()
        process.join(60)
    assert process.exitcode == 0
    after = read_snapshot_file(path, 1 << 24)
    assert after.end is not None and after.end.reason == "out_of_memory", "stopping keeps the out-of-memory"
