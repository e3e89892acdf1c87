"""Observe a model while the author's own code drives it, then judge every owner's declaration.

``observe(model, max_num_seqs=...)`` collects the model's declarations (as the engine does),
resolves them at ``max_num_seqs``, installs the process's cache observer for the duration of the
``with`` block and records each owner's call peaks; on leaving it builds ``run.report``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

from modelkv_exporter.contract.snapshot import Declaration, DiscoveredOwner, DroppedDeclaration, Observation
from modelkv_exporter.contract.vocabulary import RowDriver
from modelkv_exporter.engine.config import DiscoverySettings
from modelkv_exporter.engine.discover import Discovery
from modelkv_exporter.engine.observe import Observer, hooks, install, installed
from modelkv_exporter.engine.observe.records import OwnerState
from modelkv_exporter.engine.plain_tensors import attribute_plain
from modelkv_exporter.engine.protocol import collect_declarations, declaring_owners, near_misses
from modelkv_exporter.engine.resolve import declarer_failures, resolve_owned
from modelkv_exporter.judging.declaration_text import layout_figures
from modelkv_exporter.judging.verdicts import Verdict, VerdictKind, holder_text, judge
from modelkv_exporter.testing.caches import CacheTracker
from modelkv_exporter.testing.diagnosis import FieldProblem, diagnose
from modelkv_exporter.testing.infer import Capacity, Rows, infer_capacity, infer_rows, reached_bound, suggest
from modelkv_exporter.testing.peak_layout import CallPeak
from modelkv_exporter.testing.plain_layout import plain_layout
from modelkv_exporter.testing.recorder import OwnerRecorder, attach, detach
from modelkv_exporter.testing.report import OwnerReport, Report, Suggestion

NAMED = "named"
"""``found_by`` of an owner the author named to the check (it declares nothing)."""

DiscoverySource = Callable[[], Iterable[DiscoveredOwner]]
"""A source of discovered owners, read when the run ends (beside the check's own discovery)."""
DISCOVERY = DiscoverySettings(discover_floor_bytes=1, engine_max_discovered_owners=1024)
"""The check reports every cache a module built without declaring it, whatever its size."""
CENSUS_FLOOR = DiscoverySettings().discover_floor_bytes
"""Census finds below this (the engine's default floor, 1 MiB) are left out, as an engine leaves them out:
small tensors a module creates on first use (activation constants, lookup tables) are not caches."""


def _module_at(model: object, path: str) -> object:
    current = model
    for part in path.split(".") if path else ():
        current = getattr(current, part)
    return current


@dataclass(frozen=True)
class CheckSettings:
    """What ``check``, ``observe`` and the ``model_local_kv`` fixture take: the one list of their keywords."""

    max_num_seqs: int
    """The concurrency to resolve the declarations at (drive the model up to it to check for over-reporting)."""
    owners: Sequence[str] = ()
    """Module paths that declare nothing but should be observed too (a cache you suspect)."""
    discover: bool = True
    """Also find the modules that build caches without declaring them, as an engine does (cache layers built
    while no declaring owner runs, and a census of the tensors modules hold when the run ends)."""
    discovery: DiscoverySource | None = None
    """Another source of discovered owners (their snapshot records), read when the run ends."""
    census_floor_bytes: int = CENSUS_FLOOR
    """Census finds below this are counted, not reported, as an engine leaves them out."""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")


class CacheCheck:
    """One observed run of a model; use ``observe()`` to make one and ``with`` to run it."""

    def __init__(self, model: object, settings: CheckSettings) -> None:
        self.settings = settings
        self.model = model
        self.below_floor = 0
        self._discovery: Discovery | None = None
        self.report: Report | None = None
        self._batch: list[int | None] = [None]
        self._observer: Observer | None = None
        self._tracker = CacheTracker()
        self._recorders: dict[str, OwnerRecorder] = {}
        self._found: dict[str, OwnerRecorder] = {}
        self._declarations: tuple[Declaration, ...] = ()
        self._dropped: tuple[DroppedDeclaration, ...] = ()
        self._owners: list[tuple[str, object]] = []

    @contextlib.contextmanager
    def batch(self, size: int) -> Iterator[None]:
        """Label the calls made inside as running ``size`` sequences at once (how rows are inferred)."""
        if size < 1:
            raise ValueError(f"a batch holds at least 1 sequence, got {size}")
        before, self._batch[0] = self._batch[0], size
        first = {path: recorder.state.call_number + 1 for path, recorder in self._recorders.items()}
        try:
            yield
        finally:
            self._batch[0] = before
        for path, recorder in self._recorders.items():
            recorder.held_through(first[path], size)

    def __enter__(self) -> CacheCheck:
        if installed() is not None:
            raise RuntimeError(
                "a model-local KV observer is already installed in this process (an engine, or a check still "
                "running): run the check in a test process of its own"
            )
        collected = collect_declarations(self.model)
        self._declarations, unresolved = resolve_owned(collected.specs, self.settings.max_num_seqs)
        self._dropped = declarer_failures(collected.failures) + unresolved
        owners: list[tuple[str, object]] = list(declaring_owners(self.model))
        known = {path for path, _ in owners}
        owners += [(path, _module_at(self.model, path)) for path in self.settings.owners if path not in known]
        self._owners = owners
        self._tracker.install()
        self._tracker.seed(owner for _, owner in owners)
        observer = self._observer = install(owners, enabled=True)
        for path, owner in owners:
            state = observer.state_of(owner)
            if state is not None:
                self._recorders[path] = attach(state, self._batch, self._tracker)
        if self.settings.discover:
            declaring = {d.owner for d in self._declarations}
            self._discovery = Discovery(self.model, DISCOVERY, observer=observer, declaring=declaring)
            self._discovery.start()
            self._record_discovered()
        observer.sample()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        observer = self._observer
        if observer is None:
            return
        try:
            sampled, discovered = self._discovered(observer.sample())
            observations = {o.owner: o for o in sampled}
            if self.settings.discovery is not None and kind is None:
                discovered += tuple(self.settings.discovery())
            self.report = self._report(observer, observations, discovered)
        finally:
            if self._discovery is not None:
                self._discovery.uninstall()
                self._discovery = None
            for recorder in [*self._recorders.values(), *self._found.values()]:
                detach(recorder)
            observer.uninstall()
            self._tracker.remove()
            self._observer = None

    def _record_discovered(self) -> None:
        """Record the layers of every owner discovery attributes a cache to, from its first layer on."""
        attribute = hooks.discover
        if attribute is None:
            return

        def recording(layer: object) -> tuple[OwnerState, int] | None:
            found = attribute(layer)
            if found is not None and found[0].path not in self._found:
                self._found[found[0].path] = attach(found[0], self._batch, self._tracker)
            return found

        hooks.discover = recording

    def _discovered(
        self, observations: tuple[Observation, ...]
    ) -> tuple[tuple[Observation, ...], tuple[DiscoveredOwner, ...]]:
        """What the check's own discovery found: a census now, the plain tensors it found on an observed owner
        added to its observation (as an engine publishes them, ``attribute_plain``), then every owner beyond those
        already reported."""
        discovery = self._discovery
        if discovery is None:
            return observations, ()
        discovery.census()
        found, status = discovery.sample(observations)
        reported = {path for path, _ in self._owners}
        if not status.enabled:
            return observations, ()
        observations, found = attribute_plain(observations, found, reported)
        kept = [o for o in found if not (o.found_by in ("cache_layer", "census") and o.owner in reported)]
        small = [o for o in kept if o.found_by == "census" and o.peak_bytes < self.settings.census_floor_bytes]
        self.below_floor = len(small)
        return observations, tuple(o for o in kept if o not in small)

    def _report(
        self, observer: Observer, observations: dict[str, Observation], discovered: tuple[DiscoveredOwner, ...]
    ) -> Report:
        reports = [self._owner_report(path, owner, observations.get(path)) for path, owner in self._owners]
        reports += [self._discovered_report(found) for found in discovered]
        unavailable = observer.unavailable
        for recorder in self._recorders.values():
            unavailable = unavailable or (recorder.failure and f"the check's recorder failed: {recorder.failure}")
        return Report(
            self.settings.max_num_seqs,
            tuple(reports),
            self._dropped,
            unavailable,
            self.below_floor,
            self.settings.census_floor_bytes,
            tuple(near_misses(self.model)),
        )

    def _owner_report(self, path: str, owner: object, observation: Observation | None) -> OwnerReport:
        declarations = tuple(d for d in self._declarations if d.owner == path)
        recorder = self._recorders.get(path)
        peaks = recorder.call_peaks() if recorder is not None else ()
        declared = sum(d.peak_bytes for d in declarations)
        reached, missed = reached_bound(peaks, declarations, infer_rows(peaks, self.settings.max_num_seqs).copies)
        found_by = NAMED if path in self.settings.owners and not declarations else ""
        dropped_here = any(d.owner == path for d in self._dropped)
        if observation is None or not observation.available:
            verdict = judge(
                declared_bytes=declared,
                observed_bytes=None,
                calls=None,
                cache_calls=None,
                reached=None,
                unobserved=observation.reason or "" if observation is not None else "not observed",
            )
            return OwnerReport(path, type(owner).__name__, verdict, declarations, peaks=peaks, found_by=found_by)
        plain = observation.plain_bytes or 0
        suggestions = self._suggestions(path, peaks, observation.live_bytes)
        plain_reason = ""
        if plain:
            plain_suggestions, plain_reason = self._plain_suggestions(path, owner, plain, observation.live_bytes)
            suggestions = suggestions or plain_suggestions
        held_by = holder_text(observation.held_by, observation.held_by_class) if observation.held_by is not None else ""
        verdict = judge(
            declared_bytes=declared,
            observed_bytes=observation.peak_bytes or 0,
            calls=observation.calls,
            cache_calls=observation.cache_calls,
            reached=reached,
            not_reached=missed,
            held_by=held_by,
        )
        return OwnerReport(
            path,
            observation.owner_class,
            verdict,
            declarations,
            () if dropped_here else tuple(self._problems(declarations, peaks)),
            observation.calls,
            observation.cache_calls,
            observation.live_bytes,
            peaks,
            suggestions,
            found_by,
            plain,
            plain_reason,
        )

    def _discovered_report(self, found: DiscoveredOwner) -> OwnerReport:
        """A discovered owner: the memory it holds that it does not declare, and the declaration its layers suggest."""
        detail = "beyond the caches it declares" if found.declares else ""
        verdict = Verdict(VerdictKind.UNDECLARED, 0, found.peak_bytes, detail)
        recorder = self._found.get(found.owner) if found.found_by == "cache_layer" else None
        peaks = recorder.call_peaks() if recorder is not None else ()
        suggestions = self._suggestions(found.owner, peaks, found.live_bytes)
        if not suggestions and found.layout is not None:
            suggestions = (Suggestion(layout_figures(found.owner, found.peak_bytes, found.layout)),)
        return OwnerReport(
            found.owner,
            found.owner_class,
            verdict,
            live_bytes=found.live_bytes,
            peaks=peaks,
            suggestions=suggestions,
            found_by=found.found_by,
        )

    def _plain_suggestions(
        self, path: str, owner: object, plain: int, live_after: int | None
    ) -> tuple[tuple[Suggestion, ...], str]:
        """A suggestion from the layout of the plain tensors ``owner`` holds (``plain_layout``), and how it was read
        or why there is none."""
        layout = plain_layout(owner, plain)
        if layout.shape is None:
            return (), layout.reason
        shape = layout.shape
        if self.settings.max_num_seqs > 1 and shape.rows == self.settings.max_num_seqs:
            rows = Rows(
                RowDriver.MAX_NUM_SEQS,
                1,
                f"sized for max_num_seqs: {shape.rows} rows allocated, as many as the run's max_num_seqs",
            )
        elif self.settings.max_num_seqs > 1:
            rows = Rows(
                RowDriver.FIXED,
                shape.rows,
                f"{shape.rows} rows allocated, not the run's max_num_seqs ({self.settings.max_num_seqs})",
            )
        else:
            rows = Rows(
                None,
                shape.rows,
                f"{shape.rows} rows allocated at max_num_seqs 1: check at a larger max_num_seqs to tell a slot per "
                "sequence from a fixed count",
            )
        capacity = Capacity(
            shape.positions,
            True,
            f"{shape.positions} positions a row allocated in the plain tensors (their storage, whatever was written)",
        )
        return (Suggestion(suggest(path, shape, rows, capacity, live_after)),), layout.reason

    @staticmethod
    def _peak(peaks: Sequence[CallPeak]) -> CallPeak | None:
        return max(peaks, key=lambda p: p.bytes, default=None)

    def _problems(self, declarations: tuple[Declaration, ...], peaks: Sequence[CallPeak]) -> list[FieldProblem]:
        peak = self._peak(peaks)
        if peak is None:
            return []
        rows = infer_rows(peaks, self.settings.max_num_seqs)
        return diagnose(declarations, peak.shapes(rows.copies), rows, rows.held(peak))

    def _suggestions(self, path: str, peaks: Sequence[CallPeak], live_after: int | None) -> tuple[Suggestion, ...]:
        peak = self._peak(peaks)
        if peak is None:
            return ()
        rows = infer_rows(peaks, self.settings.max_num_seqs)
        return tuple(
            Suggestion(suggest(path, shape, rows, infer_capacity(peaks, shape, rows.copies), live_after))
            for shape in peak.shapes(rows.copies)
        )


def observe(
    model: object,
    *,
    max_num_seqs: int,
    owners: Sequence[str] = (),
    discover: bool = True,
    discovery: DiscoverySource | None = None,
    census_floor_bytes: int = CENSUS_FLOOR,
) -> CacheCheck:
    """``check``'s context-manager form: the ``with`` block drives the model, ``run.report`` holds the ``Report``.

    The keywords are ``CheckSettings``'s fields, which say what each means::

        with observe(model, max_num_seqs=2) as run:
            for size in (1, 2):
                with run.batch(size):
                    drive(model, size)
        run.report.assert_ok()
    """
    return CacheCheck(model, CheckSettings(max_num_seqs, tuple(owners), discover, discovery, census_floor_bytes))


def check(
    model: object,
    drive: Callable[..., object],
    *,
    max_num_seqs: int,
    batches: Sequence[int] = (),
    owners: Sequence[str] = (),
    discover: bool = True,
    discovery: DiscoverySource | None = None,
    census_floor_bytes: int = CENSUS_FLOOR,
) -> Report:
    """Observe ``model`` while ``drive(model)`` runs (or ``drive(model, size)`` for each of ``batches``); the report.

    The other keywords are ``CheckSettings``'s fields, which say what each means.
    """
    settings = CheckSettings(max_num_seqs, tuple(owners), discover, discovery, census_floor_bytes)
    with CacheCheck(model, settings) as run:
        if batches:
            for size in batches:
                with run.batch(size):
                    drive(model, size)
        else:
            drive(model)
    assert run.report is not None
    return run.report
