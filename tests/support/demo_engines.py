"""Demo engines run as the demo runs them (their own processes, real transformers caches), for tests that need a
live spool like the demo's."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator
from pathlib import Path

from modelkv_exporter.demo.engines import DEMO_ENGINES, run_engine
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_testbed.polling import eventually


def _published(spool: Path, engine_ids: tuple[str, ...]) -> bool:
    """Every engine has beaten with what its caches held: observations of its owners, or what discovery found."""
    found = {s.engine.engine_id: s for _, s in SpoolReader(spool).scan().snapshots}
    return all(
        engine in found
        and bool(found[engine].measured.current)
        and bool(found[engine].observations or found[engine].discovered)
        for engine in engine_ids
    )


@contextlib.contextmanager
def running_demo_engines(spool: Path, engine_ids: tuple[str, ...], interval: float = 1.0) -> Iterator[None]:
    """The demo engines ``engine_ids`` publishing into ``spool`` every ``interval`` seconds until the block ends."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    processes = [
        context.Process(target=run_engine, args=(engine, str(spool), interval, stop), daemon=True)
        for engine in DEMO_ENGINES
        if engine.engine_id in engine_ids
    ]
    for process in processes:
        process.start()
    try:
        eventually(lambda: _published(spool, engine_ids), "the demo engines' observed caches", timeout=180)
        yield
    finally:
        stop.set()
        for process in processes:
            process.join(60)
