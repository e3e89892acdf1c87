"""``SnapshotPublisher``: keeps one live engine's snapshot current in the spool.

Heartbeats, measurements, observations, the ending write (why the engine ended, and its memory then), the liveness
lock beside the snapshot. Stdlib only, so any engine (not only vLLM) can use it. Plain
tensors the census finds on a declaring owner are published in its observation (``plain_tensors``).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from modelkv_exporter.contract.snapshot import (
    DiscoveredOwner,
    DiscoveryStatus,
    EndState,
    Measured,
    MemorySample,
    Observation,
    Snapshot,
)
from modelkv_exporter.contract.spool import (
    hold_alive,
    let_go_alive,
    remove_orphaned_temp_files,
    snapshot_file_name,
    write_snapshot,
)
from modelkv_exporter.contract.vocabulary import EndReason
from modelkv_exporter.engine.ending import end_reason, error_line
from modelkv_exporter.engine.engine_log import flush, get_logger, pending, report
from modelkv_exporter.engine.plain_tensors import attribute_plain
from modelkv_exporter.engine.samplers import Sampler

logger = get_logger("heartbeat")

ENDING_WAIT = 5.0
"""Seconds a model thread whose step raised waits for its ending to be written (``SnapshotPublisher.died``)."""

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
    if observations is not None and discovered is not None:
        observations, found = attribute_plain(observations, discovered[0])
        discovered = (found, discovered[1])
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
    beat is logged at the end of each beat, holding no lock. A logging handler that raises there,
    even ``SystemExit``, loses its line and never the heartbeat (``handler_failure`` says what it raised).
    An engine ``watch``ed and dropped without ``end`` has its snapshot ended at the next beat.

    The first write takes the engine's liveness lock (``contract.spool.hold_alive``, without waiting); the ending
    write lets go of it, as does ``stop``. A lock that cannot be taken is logged once and the snapshot is written
    without it (its reader then cannot tell a killed engine from a hung one). The ending write (``end``, or
    ``died`` while an exception that ends the engine propagates) takes a last memory sample, the observations and
    torch's largest segments through what ``start_heartbeat`` was given, and records why the engine ended; the first
    ending wins (a shutdown after an out-of-memory leaves the out-of-memory).
    """

    def __init__(self, spool_dir: str | os.PathLike[str], snapshot: Snapshot) -> None:
        self.spool_dir = Path(spool_dir)
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._watched: weakref.ReferenceType[object] | None = None
        self._on_gone: Callable[[], None] | None = None
        self.handler_failure: str | None = None
        """What a logging handler raised on a thread of ours beyond an ``Exception`` (its line was lost), if one did."""
        self.stopped: str | None = None
        """Why the heartbeat thread stopped by itself (its engine dropped, something raised into it), if it did."""
        self._alive: int | None = None
        self._alive_asked = False
        self._sampler: Sampler | None = None
        self._observe: Observe | None = None
        self._discovery: DiscoverySource | None = None
        remove_orphaned_temp_files(self.spool_dir, snapshot.engine.engine_id)

    @property
    def snapshot(self) -> Snapshot:
        """The snapshot as last published (or about to be)."""
        return self._snapshot

    @property
    def holds_alive(self) -> bool:
        """Whether this publisher holds its engine's liveness lock now."""
        return self._alive is not None

    def write(self) -> Path:
        """Write the current snapshot now; raises ``OSError`` when the spool refuses."""
        with self._lock:
            return self._write()

    def update(self, change: Callable[[Snapshot], Snapshot]) -> Path:
        """Apply ``change`` to the snapshot, stamp a heartbeat, and write it."""
        with self._lock:
            self._snapshot = replace(change(self._snapshot), heartbeat_at=time.time())
            return self._write()

    def _write(self) -> Path:
        """Write the snapshot (under the lock), taking the liveness lock first, once, unless it has ended."""
        if not self._alive_asked and not self._snapshot.ended:
            self._alive_asked = True
            try:
                self._alive = hold_alive(self.spool_dir, self._snapshot.engine.engine_id)
            except OSError as error:
                report(
                    logger,
                    "modelkv: cannot take the liveness lock of %s in %s; a kill will read as stale",
                    self._snapshot.engine.engine_id,
                    self.spool_dir,
                    error=error,
                )
        return write_snapshot(self.spool_dir, self._snapshot)

    def _let_go(self) -> None:
        alive, self._alive = self._alive, None
        if alive is not None:
            try:
                let_go_alive(alive)
            except OSError:
                pass

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

    def watch(self, engine: object, on_gone: Callable[[], None] | None = None) -> None:
        """End the snapshot at the first beat after ``engine`` (held weakly: a worker) is gone without ``end``, then
        run ``on_gone`` on the heartbeat thread and stop beating: an engine dropped without shutdown is not rewritten
        forever. An engine that cannot be held weakly is not watched."""
        try:
            watched = weakref.ref(engine)
        except TypeError:
            return
        self._on_gone = on_gone
        self._watched = watched

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
        self._sampler, self._observe, self._discovery = sampler, observe, discovery
        self._thread = threading.Thread(
            target=self._run, args=(interval, sampler, observe, discovery), name="modelkv-heartbeat", daemon=True
        )
        self._thread.start()

    def _run(
        self, interval: float, sampler: Sampler | None, observe: Observe | None, discovery: DiscoverySource | None
    ) -> None:
        """The heartbeat thread (ours: whatever reaches it, a handler's ``SystemExit`` included, is contained here)."""
        try:
            self._beat_until_stopped(interval, sampler, observe, discovery)
        except BaseException as error:  # noqa: BLE001 - our own thread: nothing of the model's runs here
            self.stopped = f"{type(error).__name__} raised into the heartbeat thread"
            report(logger, "modelkv: the heartbeat of %s stopped: %s", self.spool_dir, self.stopped)
        self._log()

    def _beat_until_stopped(
        self, interval: float, sampler: Sampler | None, observe: Observe | None, discovery: DiscoverySource | None
    ) -> None:
        def change(snapshot: Snapshot) -> Snapshot:
            # Sampled under the publisher's lock, so a beat from another thread never lands between
            # this sample and its write and then gets overwritten by older figures.
            if snapshot.ended:
                return snapshot
            observations = observe() if observe else None
            discovered = discovery.sample(observations or ()) if discovery else None
            return _with_figures(snapshot, sampler() if sampler else None, observations, discovered)

        while not self._stop.wait(interval):
            watched = self._watched
            if watched is not None and watched() is None:
                self._gone()
                return
            failure = None
            try:
                if discovery is not None:
                    discovery.census()
                self.update(change)
            except Exception as error:
                failure = error
            if failure is not None and not self._failing:
                report(logger, "modelkv: cannot refresh snapshot in %s", self.spool_dir, error=failure)
            self._failing = failure is not None
            self._log()

    def _gone(self) -> None:
        """The watched engine is gone without ``end`` (on the heartbeat thread): end its snapshot, release it."""
        self._stop.set()
        self.stopped = "the engine was dropped without shutdown"
        try:
            self._end(EndReason.SHUTDOWN)
        except Exception as error:
            report(
                logger, "modelkv: cannot mark the dropped engine's snapshot ended in %s", self.spool_dir, error=error
            )
        on_gone, self._on_gone = self._on_gone, None
        try:
            if on_gone is not None:
                on_gone()
        except Exception as error:
            report(logger, "modelkv: cannot release the dropped engine", error=error)
        report(
            logger, "modelkv: %s was dropped without shutdown; its snapshot is ended", self._snapshot.engine.engine_id
        )

    def _log(self) -> None:
        """Log what was reported, on a thread of ours; remember what a handler raised beyond an ``Exception``."""
        escaped = flush(own_thread=True)
        if escaped is not None and self.handler_failure is None:
            self.handler_failure = f"a logging handler raised {escaped}; its line was lost"

    def stop(self) -> None:
        """Stop the heartbeat thread (the file stays as last written), let go of the liveness lock, and log what was
        not logged yet.

        The lines are logged on a thread of ours (a short one), so that a logging handler's exception, even
        ``SystemExit``, never reaches the caller; an asynchronous exception of the caller's passes.
        """
        self._stop_beating()
        with self._lock:
            self._let_go()

    def _stop_beating(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if pending():
            logging = threading.Thread(target=self._log, name="modelkv-log", daemon=True)
            try:
                logging.start()
            except RuntimeError:  # the interpreter is shutting down: the lines stay unlogged
                return
            logging.join(timeout=5)

    def end(self) -> Path:
        """Stop beating and write the ending (``shutdown``), so the sidecar stops exporting the engine. Idempotent: a
        snapshot that ended already stays as it ended (a shutdown after an out-of-memory leaves the out-of-memory)."""
        self._stop_beating()
        return self._end(EndReason.SHUTDOWN)

    def died(self, error: BaseException) -> Path:
        """``error`` is ending the engine (raised by its step, not yet handled): write the ending now, with the memory
        as the exception left it, and why (``engine.ending``: ``out_of_memory`` or ``error``, and the exception's type
        and first line). Keeps nothing of ``error``.

        The caller is the model's thread, so the ending is written on a short thread of ours, which takes the locks a
        beat holds; the caller waits for that thread (its frames, still holding what the step allocated, are then
        sampled), never for a lock, and at most ``ENDING_WAIT`` seconds: a beat stuck behind something the model's
        thread holds gets the ending written when it lets go, and the engine's error goes on. Idempotent like ``end``.
        """
        self._stop.set()
        reason, line = end_reason(error), error_line(error)
        ending = threading.Thread(target=self._end_quietly, args=(reason, line), name="modelkv-ending", daemon=True)
        try:
            ending.start()
        except RuntimeError:  # the interpreter is shutting down: no ending
            pass
        else:
            ending.join(timeout=ENDING_WAIT)
        return self.spool_dir / snapshot_file_name(self._snapshot.engine.engine_id)

    def _end_quietly(self, reason: EndReason, error: str) -> None:
        """``_end`` on a thread of ours: a spool that refuses it is logged; anything else raised there stays there."""
        try:
            self._end(reason, error)
        except Exception as failure:
            report(logger, "modelkv: cannot write the ending in %s", self.spool_dir, error=failure)

    def _end(self, reason: EndReason, error: str = "") -> Path:
        """The ending write: a last sample, the observations now, why the engine ended; then let go of liveness."""
        with self._lock:
            try:
                if not self._snapshot.ended:
                    self._snapshot = self._ending(reason, error)
                    return self._write()
                return self.spool_dir / snapshot_file_name(self._snapshot.engine.engine_id)
            finally:
                self._let_go()

    def _ending(self, reason: EndReason, error: str) -> Snapshot:
        sample = _guarded(self._sampler)
        observations = _guarded(self._observe)
        discovery = self._discovery
        discovered = _guarded(lambda: discovery.sample(observations or ())) if discovery is not None else None
        largest = getattr(self._sampler, "largest_segments", None)
        segments = _guarded(largest) if callable(largest) else None
        values = sample.values if sample is not None else {}
        reserved, allocated = values.get("torch_reserved"), values.get("torch_allocated")
        free = max(reserved - allocated, 0) if reserved is not None and allocated is not None else None
        state = EndState(
            reason=reason.value, at=time.time(), error=error, reserved_free_bytes=free, largest_segments=segments
        )
        snapshot = _with_figures(self._snapshot, sample, observations, discovered)
        return replace(snapshot, ended=True, end=state, heartbeat_at=time.time())


def _guarded(read: Callable[[], Any] | None) -> Any:
    """``read()``, or None where there is nothing to read or it fails (the figure keeps its last value)."""
    if read is None:
        return None
    try:
        return read()
    except Exception:
        return None
