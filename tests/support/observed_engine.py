"""A real engine process whose declaring owner keeps being called but whose cache has stopped working.

Everything in it is real: the demo's talker owner and its declaration, the observer installed in
the process, the ``SnapshotPublisher`` and its heartbeat. What is deliberate is the owner's step:
it runs many times a second and never touches the cache it declares, which is what
``ModelKVDeclaredCacheUnused`` exists to catch.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.synchronize

import torch
from torch import nn

from modelkv_exporter.demo.owners import TalkerGenerator
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.observe import install
from modelkv_exporter.engine.protocol import declaring_owners
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_exporter.engine.samplers import sample_host_memory

ENGINE_ID = "live-cache-unused"
OWNER = "talker.audio_generator"


class CachelessTalker(TalkerGenerator):
    """Ming's talker after its cache path was switched off: it still declares the cache, every step skips it."""

    def step(self) -> torch.Tensor:
        """One generation step without the cache: the attention is recomputed, nothing is kept."""
        return torch.ones(4, 4) @ torch.ones(4, 4)


def run(spool_dir: str, interval: float, stop: multiprocessing.synchronize.Event) -> None:
    """The engine process: publish, observe, and call the owner's step until told to stop."""
    model = nn.Module()
    model.talker = nn.Module()
    model.talker.audio_generator = CachelessTalker()
    snapshot = build_snapshot(model, max_num_seqs=4, engine_id=ENGINE_ID, served_model_name="ming-cache-off")
    observer = install(declaring_owners(model))
    publisher = SnapshotPublisher(spool_dir, snapshot)
    publisher.set_baseline(sample_host_memory())
    publisher.start_heartbeat(interval, sample_host_memory, observer.sample)
    while not stop.wait(0.05):
        model.talker.audio_generator.step()
    publisher.end()


def start(
    spool_dir: str, interval: float = 0.5
) -> tuple[multiprocessing.context.SpawnProcess, multiprocessing.synchronize.Event]:
    """Start the engine in its own spawned process; returns it and its stop event."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    process = context.Process(target=run, args=(spool_dir, interval, stop), name=ENGINE_ID, daemon=True)
    process.start()
    return process, stop
