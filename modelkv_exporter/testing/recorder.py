"""Per owner and per call: the most its cache layers held at once, and their geometry at that moment.

Attached to the observer's owner counters (``OwnerState.on_change``), so it sees every change the
observer counts, under the observer's lock. It re-reads the owner's live layers only when the
current call's high-water rises, and asks the run's ``CacheTracker`` which cache each layer belongs to.
For tests: it walks every observed layer each time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from modelkv_exporter.engine.observe import hooks
from modelkv_exporter.engine.observe.records import OwnerState
from modelkv_exporter.testing.caches import CacheTracker
from modelkv_exporter.testing.peak_layout import CallPeak, HeldLayers, group_layers


@dataclass
class _Current:
    call: int
    batch: int | None
    bytes: int = -1
    held: tuple[HeldLayers, ...] = ()
    other: int = 0


@dataclass
class OwnerRecorder:
    """The call peaks of one owner."""

    state: OwnerState
    batch: list[int | None]
    """The run's current batch label, shared by every recorder of the run (a one-item list)."""
    tracker: CacheTracker | None = None
    """Which cache each layer belongs to (None: every layer counts as one cache's)."""
    peaks: dict[tuple[int, int | None], _Current] = field(default_factory=dict)
    """By call and batch label: a discovered owner has no calls of its own, only the batches it ran in."""
    failure: str | None = None

    def changed(self, state: OwnerState) -> None:
        """The owner's live bytes changed: when the current call's high-water rose, read its layers."""
        try:
            call, batch = state.call_number, self.batch[0]
            current = self.peaks.get((call, batch))
            if current is None:
                current = self.peaks[(call, batch)] = _Current(call, batch)
            if state.live <= current.bytes:
                return
            current.bytes = state.live
            if self.tracker is not None:
                self.tracker.note_stack()
            self._read(current)
        except Exception as error:  # never into the model's call
            self.failure = self.failure or f"{type(error).__name__}: {error}"

    def _read(self, current: _Current) -> None:
        state, tracker = self.state, self.tracker
        layers = [
            (layer, record.bytes)
            for record in list(hooks.records.values())
            if record.owner is state
            for layer in (record(),)
            if layer is not None
        ]
        current.held, current.other = group_layers(layers, tracker.layer_caches() if tracker else None)

    def held_through(self, first_call: int, batch: int | None) -> None:
        """After a batch ran calls ``first_call`` on: if none of them changed the bytes its caches hold (static
        caches captured earlier, reused), the last of them held what is live now."""
        state = self.state
        try:
            with hooks.lock:
                if state.call_number < first_call or state.live <= 0:
                    return
                if any(call >= first_call and label == batch for call, label in self.peaks):
                    return
                current = self.peaks[(state.call_number, batch)] = _Current(state.call_number, batch, state.live)
                self._read(current)
        except Exception as error:
            self.failure = self.failure or f"{type(error).__name__}: {error}"

    def call_peaks(self) -> tuple[CallPeak, ...]:
        """Every call that held cache memory, in call order."""
        return tuple(CallPeak(c.call, c.batch, c.bytes, c.held, c.other) for c in self.peaks.values() if c.bytes > 0)


def attach(state: OwnerState, batch: list[int | None], tracker: CacheTracker | None = None) -> OwnerRecorder:
    """Record ``state``'s call peaks from now on."""
    recorder = OwnerRecorder(state, batch, tracker)
    state.on_change = recorder.changed
    return recorder


def detach(recorder: OwnerRecorder) -> None:
    """Stop recording."""
    if recorder.state.on_change == recorder.changed:
        recorder.state.on_change = None
