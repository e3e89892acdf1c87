"""``SnapshotPublisher``: keeps one live engine's snapshot current in the spool.

Heartbeats, measurements, observations, the end mark. Stdlib only, so any engine (not only vLLM) can use it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from modelkv_exporter.contract.snapshot import (
    DiscoveredOwner,
    DiscoveryStatus,
    Measured,
    MemorySample,
    Observation,
    Snapshot,
)
from modelkv_exporter.contract.spool import remove_orphaned_temp_files, snapshot_file_name, write_snapshot
from modelkv_exporter.engine.log import flush, get_logger
from modelkv_exporter.engine.samplers import Sampler

logger = get_logger("heartbeat")

Observe = Callable[[], Sequence[Observation]]
"""Takes one sample of what the engine's declaring owners' caches hold (``Observer.sample``)."""
Discovered = tuple[tuple[DiscoveredOwner, ...], DiscoveryStatus]
"""The discovered owners and the discovery status (``Discovery.sample``)."""


class DiscoverySource(Protocol):
    """What the heartbeat asks of discovery (``engine.discover.Discovery``)."""

    def census(self) -> None:
        """Run the census when it is due; called outside the publisher's lock (a census yields)."""

    def sample(self, observations: Sequence[Observation] = ()) -> Discovered:
        """The discovered owners and the status now, given the same beat's observations."""


def with_baseline(snapshot: Snapshot, sample: MemorySample) -> Snapshot:
    """``snapshot`` with ``sample`` as both its baseline and its current measurement."""
    return replace(snapshot, measured=Measured(current=sample, baseline=sample))


def _with_figures(
    snapshot: Snapshot,
    sample: MemorySample | None,
    observations: Sequence[Observation] | None,
    discovered: Discovered | None = None,
) -> Snapshot:
    if sample is not None:
        snapshot = replace(snapshot, measured=replace(snapshot.measured, current=sample))
    if observations is not None:
        snapshot = replace(snapshot, observations=tuple(observations))
    if discovered is not None:
        snapshot = replace(snapshot, discovered=discovered[0], discovery=discovered[1])
    return snapshot


class SnapshotPublisher:
    """Owns one engine's snapshot and rewrites it atomically on every change.

    ``start_heartbeat`` runs a daemon thread that samples memory (and, when given,
    the observed caches) and rewrites the file every ``interval`` seconds; a failing
    write is logged once and retried at the next beat, keeping the last good file in place.
    The heartbeat thread is where the engine side logs: what was ``report``ed since the last
    beat is logged at the end of each beat, holding no lock.
    """

    def __init__(self, spool_dir: str | os.PathLike[str], snapshot: Snapshot) -> None:
        self.spool_dir = Path(spool_dir)
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        remove_orphaned_temp_files(self.spool_dir, snapshot.engine.engine_id)

    @property
    def snapshot(self) -> Snapshot:
        """The snapshot as last published (or about to be)."""
        return self._snapshot

    def write(self) -> Path:
        """Write the current snapshot now; raises ``OSError`` when the spool refuses."""
        with self._lock:
            return write_snapshot(self.spool_dir, self._snapshot)

    def update(self, change: Callable[[Snapshot], Snapshot]) -> Path:
        """Apply ``change`` to the snapshot, stamp a heartbeat, and write it."""
        with self._lock:
            self._snapshot = replace(change(self._snapshot), heartbeat_at=time.time())
            return write_snapshot(self.spool_dir, self._snapshot)

    def beat(
        self,
        sample: MemorySample | None = None,
        observations: Sequence[Observation] | None = None,
        discovered: Discovered | None = None,
    ) -> Path:
        """A heartbeat, with a new current memory sample, observations and discovered owners when they are given."""
        return self.update(lambda snapshot: _with_figures(snapshot, sample, observations, discovered))

    def set_baseline(self, sample: MemorySample) -> Path:
        """Record ``sample`` as the post-initialisation baseline (and as current)."""
        return self.update(lambda s: with_baseline(s, sample))

    def start_heartbeat(
        self,
        interval: float,
        sampler: Sampler | None = None,
        observe: Observe | None = None,
        discovery: DiscoverySource | None = None,
    ) -> None:
        """Beat every ``interval`` seconds in a daemon thread until ``stop``/``end``."""
        if self._thread is not None:
            return
        self._snapshot = replace(self._snapshot, heartbeat_interval_seconds=interval)
        self._thread = threading.Thread(
            target=self._run, args=(interval, sampler, observe, discovery), name="modelkv-heartbeat", daemon=True
        )
        self._thread.start()

    def _run(
        self, interval: float, sampler: Sampler | None, observe: Observe | None, discovery: DiscoverySource | None
    ) -> None:
        def change(snapshot: Snapshot) -> Snapshot:
            # Sampled under the publisher's lock, so a beat from another thread never lands between
            # this sample and its write and then gets overwritten by older figures.
            observations = observe() if observe else None
            discovered = discovery.sample(observations or ()) if discovery else None
            return _with_figures(snapshot, sampler() if sampler else None, observations, discovered)

        while not self._stop.wait(interval):
            failure = None
            try:
                if discovery is not None:
                    discovery.census()
                self.update(change)
            except Exception as error:
                failure = error
            flush()
            if failure is not None and not self._failing:
                logger.warning("modelkv: cannot refresh snapshot in %s: %s", self.spool_dir, failure)
            self._failing = failure is not None

    def stop(self) -> None:
        """Stop the heartbeat thread (the file stays as last written), and log what it had not logged yet."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        flush()

    def end(self) -> Path:
        """Stop beating and mark the snapshot ended, so the sidecar stops exporting it. Idempotent."""
        self.stop()
        if self._snapshot.ended:
            return self.spool_dir / snapshot_file_name(self._snapshot.engine.engine_id)

        return self.update(lambda s: replace(s, ended=True))
