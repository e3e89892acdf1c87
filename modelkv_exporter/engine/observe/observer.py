"""The process's one installation of the hooks, and one view of it per model.

``install`` hooks the classes the first time it runs (``Installation``: the class patches, shared by every model
in the process) and returns a new ``Observer`` for the owners it is given: each model's heartbeat samples its own
owners only, so two models in one process (an RL trainer runs vLLM beside training) never publish each other's
caches. The hot path is the same whatever the number of models: a hook finds an owner's state by the owner object
(``hooks.owners``). Removing a model's view takes its owners out and leaves the other models' hooks in place; the
last view removes the hooks.

A sample runs on the heartbeat thread beside the model: it holds ``hooks.lock``, which no cache update waits for
(``hooks`` hands the model's changes over without a lock), and lets the model's threads have the interpreter
between every ``CHUNK`` layers it re-weighs, so a model thread waiting for the GIL waits one chunk, not the
switch interval. It re-weighs only the layers that changed since the last sample, and a few more in turn
(``tally``); ``recount`` re-weighs every layer given (discovery's owners).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from modelkv_exporter.contract.snapshot import Observation
from modelkv_exporter.engine.config import observation_enabled
from modelkv_exporter.engine.engine_log import flush, report
from modelkv_exporter.engine.observe import hooks, tally, transformers_check
from modelkv_exporter.engine.observe.layers import (
    StorageKey,
    forget_plans,
)
from modelkv_exporter.engine.observe.patches import ClassPatches
from modelkv_exporter.engine.observe.records import LayerRecord, OwnerState

OFF = "observation is turned off (MODELKV_OBSERVE=0)"
NO_CALL = "no call of this owner has been observed yet"
MOVED = "another model in this process observes this module now"

_installed: Installation | None = None
_lock = threading.Lock()


class Installation:
    """What ``install`` hooked in this process, shared by every model's ``Observer`` (its ``views``)."""

    def __init__(self, transformers_version: str) -> None:
        self.transformers_version = transformers_version
        self.unavailable: str | None = None
        """Why nothing can be observed (transformers internals unknown); None when observing."""
        self.patches = ClassPatches()
        self.views: list[Observer] = []
        """The observers ``install`` returned that were not uninstalled yet, one a model."""

    def uninstall(self) -> None:
        """Remove every hook and wrapper, and forget every model's owners and all state."""
        with _lock:
            self._remove()

    def _remove(self) -> None:
        """``uninstall``, holding ``_lock``."""
        global _installed
        hooks.deactivate()
        self.patches.remove()
        hooks.reset()
        tally.reset()
        forget_plans()
        for view in self.views:
            view.forget()
        self.views.clear()
        if _installed is self:
            _installed = None


class Observer:
    """One model's owners and their figures. ``enabled`` False: nothing is hooked and every figure is absent."""

    def __init__(self, enabled: bool, transformers_version: str = "", installation: Installation | None = None) -> None:
        self.enabled = enabled
        self.transformers_version = transformers_version
        self.unavailable: str | None = None if enabled else OFF
        """Why no owner can be observed (off, or transformers internals unknown); None when observing."""
        self.installation = installation
        """The hooks this observer's owners are observed through; None when off, or once uninstalled."""
        self._owners: dict[int, OwnerState] = {}

    @property
    def attached(self) -> bool:
        """Whether this observer is one of the installed hooks' views (not off, not uninstalled)."""
        installation = self.installation
        return installation is not None and installation is _installed

    def add_owners(self, owners: Iterable[tuple[str, object]]) -> None:
        """Observe these ``(path, owner)`` pairs from now on (an owner object already observed is skipped).

        An owner object another model's observer observes too (a module two models share) is observed here from
        now on; there its figures become absent (``MOVED``).
        """
        for path, owner in owners:
            known = self._owners.get(id(owner))
            if known is not None and known.owner_ref() is owner:
                continue
            state = OwnerState(path, owner)
            self._owners[id(owner)] = state
            installation = self.installation
            if self.unavailable is None and installation is not None:
                other = hooks.owners.get(id(owner))
                if other is not None and other.owner_ref() is owner:
                    other.unknown = MOVED
                installation.patches.hook_owner(owner, state)

    def state_of(self, owner: object) -> OwnerState | None:
        """The state of ``owner`` when this observer observes it."""
        state = self._owners.get(id(owner))
        return state if state is not None and state.owner_ref() is owner else None

    def owner_states(self) -> dict[str, OwnerState]:
        """Every owner this observer observes, its state by its path."""
        return {state.path: state for state in self._owners.values()}

    def sample(self) -> tuple[Observation, ...]:
        """This observer's owners' figures now, and the start of their next interval. Never raises; takes
        ``hooks.lock`` only briefly (``CHUNK`` layers at a time)."""
        try:
            return self._sample()
        except Exception as error:
            hooks.fail("sample", error)
            return tuple(self._absent(state, hooks.broken()) for state in list(self._owners.values()))

    def _absent(self, state: OwnerState, reason: str | None) -> Observation:
        calls = state.calls if self.unavailable is None else None
        return Observation(state.path, state.class_name, False, reason or "observation is not active", calls=calls)

    def _sample(self) -> tuple[Observation, ...]:
        with tally.sampling:
            return self._sample_now()

    def _sample_now(self) -> tuple[Observation, ...]:
        observing = hooks.active()
        tally.refresh(observing)
        out = []
        for key, state in list(self._owners.items()):
            if state.owner_ref() is None:  # the model was released (a reload): its owners are gone
                del self._owners[key]
                if hooks.owners.get(key) is state:
                    del hooks.owners[key]
                continue
            live, failure = self._recount(state, observing)
            with hooks.lock:
                reason = (
                    self.unavailable
                    or hooks.broken()
                    or (None if observing else "observation is not active")
                    or failure
                    or state.unknown
                    or state.graph
                    or (None if state.calls else NO_CALL)
                )
                if reason is not None:
                    out.append(self._absent(state, reason))
                else:
                    out.append(
                        Observation(
                            owner=state.path,
                            owner_class=state.class_name,
                            available=True,
                            peak_bytes=state.high_water,
                            recent_peak_bytes=state.interval_high_water,
                            live_bytes=live,
                            calls=state.calls,
                            cache_calls=state.cache_calls,
                            held_by=None if state.wrote_held is None else state.wrote_held.path,
                            held_by_class=None if state.wrote_held is None else state.wrote_held.class_name,
                        )
                    )
                next_interval(state, live, observing)
        return tuple(out)

    def _recount(self, state: OwnerState, observing: bool) -> tuple[int, str | None]:
        return tally.figures(state, observing)

    def forget(self) -> None:
        """Stop observing this observer's owners (the hooks stay in place for other models)."""
        for key, state in list(self._owners.items()):
            if hooks.owners.get(key) is state:
                del hooks.owners[key]
        self._owners.clear()
        self.installation = None

    def uninstall(self) -> None:
        """Stop observing this model's owners; the last model's observer removes every hook and wrapper too.

        Another model's observer keeps observing, through the same hooks.
        """
        with _lock:
            installation = self.installation
            self.forget()
            if installation is not None and self in installation.views:
                installation.views.remove(self)
                if not installation.views:
                    installation._remove()


def recount(
    state: OwnerState, records: list[LayerRecord], observing: bool, found: dict[StorageKey, int] | None = None
) -> tuple[int, str | None]:
    """Re-weigh an owner's live layers exactly (``tally.in_chunks``, ``tally.weigh_layer``): storages de-duplicated,
    drift outside ``update`` corrected, each layer's correction counted after the changes the model handed over
    before it. Returns the bytes live now and why they cannot be trusted, if they cannot; ``found``, when given,
    receives the storages weighed."""
    found = {} if found is None else found
    failures: list[str] = []

    def each(record: LayerRecord) -> None:
        weighed = tally.weigh_layer(record, observing)
        if isinstance(weighed, str):
            failures.append(weighed)
        elif weighed is not None:
            found.update(weighed)

    tally.in_chunks(records, each)
    live = sum(found.values())
    devices = sorted({device for device, _ in found})
    failure = failures[0] if failures else None
    if len(devices) > 1:
        failure = failure or f"cache tensors on several devices {devices}: offloaded caches are not observed"
    if observing:
        tally.raise_high_waters(state, live)
    return live, failure


def next_interval(state: OwnerState, live: int, observing: bool) -> None:
    """Start the owner's next sample interval (holding ``hooks.lock``): its high-water starts at what is live now."""
    state.interval_high_water = max(live, state.live) if observing else live


def _forked() -> None:
    """In a child forked while another thread installed or removed hooks: a lock no thread holds."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def installed() -> Installation | None:
    """The hooks installed in this process, if any (shared by every model's observer)."""
    return _installed


def _new_installation() -> Installation:
    import transformers

    installation = Installation(getattr(transformers, "__version__", "?"))
    cache_utils, reason = transformers_check.names()
    if reason is None:
        installation.patches.install(cache_utils)
        hooks.activate()
        reason = transformers_check.self_test(cache_utils) or hooks.broken()
        if reason is not None:
            hooks.deactivate()
            installation.patches.remove()
            hooks.records.clear()
    if reason is not None:
        installation.unavailable = (
            f"transformers {installation.transformers_version} keeps caches in an unknown way: {reason}"
        )
        report(hooks.logger, "modelkv: model-local KV observation unavailable: %s", installation.unavailable)
    return installation


def install(owners: Iterable[tuple[str, object]], *, enabled: bool | None = None) -> Observer:
    """Observe ``owners``, one model's: a new observer of the process's hooks, installed on first use. Never raises.

    Each call returns an observer of its own, which samples only the owners given to it (``add_owners`` adds more);
    the hooks are installed once and shared. Turned off (``enabled`` False, or ``MODELKV_OBSERVE=0`` when
    ``enabled`` is None), it hooks nothing and returns an observer whose figures are all absent with that reason.
    So does a ``transformers`` whose caches fail the install-time self-test.
    """
    global _installed
    owners = list(owners)
    if not (observation_enabled() if enabled is None else enabled):
        observer = Observer(False)
        observer.add_owners(owners)
        return observer
    try:
        with _lock:
            view: Observer | None = None
            try:
                if _installed is None:
                    _installed = _new_installation()
                view = Observer(True, _installed.transformers_version, _installed)
                view.unavailable = _installed.unavailable
                _installed.views.append(view)
                view.add_owners(owners)
                return view
            except Exception as error:
                hooks.fail("install", error)
                fallback = view or Observer(True)
                fallback.unavailable = fallback.unavailable or hooks.broken()
                return fallback
    finally:
        flush()  # at load, on the loading thread, holding no lock
