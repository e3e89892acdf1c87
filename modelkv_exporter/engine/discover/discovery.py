"""``Discovery``: the modules that hold caches they do not declare, and the figures published for them.

Two ways of finding them (``contract.vocabulary.DiscoveryMethod``):

- ``cache_layer``: a ``transformers`` cache layer created, copied or first used while no declaring
  owner runs belongs to the innermost module of the model on the call stack whose code names it
  (``ModuleMap.codes``, walked by ``stack.innermost``: the model's frames are matched by ``f_code``
  alone, never by their locals), looked up once, when the layer is first seen (``hooks.discover``).
  A layer no module was found for is held ``OUTSIDE`` until a census finds the innermost module that
  holds it. From then on it is weighed exactly as a declaring owner's layers are (``observe``'s
  records, re-weighed at every sample).
- ``census``: at load, the storages reachable from the modules are the baseline; every
  ``census_interval`` the heartbeat thread walks them again (``census``), and storages that are
  not parameters nor computed weights (a legacy ``weight_norm``'s), not in the baseline, not the
  paged KV cache and not behind an observed cache layer belong to the innermost module that holds them.

Several models in one process (an RL trainer runs vLLM beside training) each have a ``Discovery`` of their own,
which publishes its own model's owners only. The hooks have one callback: with one model it is that model's
``attribute``; with several, ``Several.attribute``, one walk of the stack over every model's code, which gives a
layer to the model whose module is on the stack (``stack``: where the models run the same code, the nearest
``nn.Module`` call tells them apart). A newer ``Discovery`` of the same root module replaces the older one; one
that failed stays in the walk, so that its model's layers go to no other model (``DROPPED``).

Whatever fails inside discovery is reported once (``engine_log.report``: queued, logged later by the heartbeat
thread) and turns discovery off; the model never sees it, not even at the recursion limit.
"""

from __future__ import annotations

import copy
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from modelkv_exporter.contract.snapshot import DiscoveredOwner, DiscoveryStatus, KVLayout, Observation
from modelkv_exporter.contract.vocabulary import DiscoveryMethod
from modelkv_exporter.engine import tensors
from modelkv_exporter.engine.config import DiscoverySettings, HookConfig
from modelkv_exporter.engine.discover import census, locals_walk, stack
from modelkv_exporter.engine.discover.census import CensusResult
from modelkv_exporter.engine.discover.discovered_layout import seen_layout, widest
from modelkv_exporter.engine.discover.module_map import ModuleMap
from modelkv_exporter.engine.engine_log import get_logger, report
from modelkv_exporter.engine.observe import Observer, hooks
from modelkv_exporter.engine.observe.layers import StorageKey, held_storages, readable_storages
from modelkv_exporter.engine.observe.observer import recount
from modelkv_exporter.engine.observe.records import LayerRecord, OwnerState
from modelkv_exporter.engine.observe.tally import CHUNK
from modelkv_exporter.engine.protocol import unwrap_model

logger = get_logger("discover")

OUTSIDE = "<outside the model>"
"""Where layers go that no module of the model built: held, weighed, never published."""
DROPPED = "<a model whose discovery is off>"
"""Where layers go that a module of a model whose discovery failed built, while other models discover."""
OFF = "discovery is turned off (MODELKV_DISCOVER=0)"
OBSERVE_OFF = "discovery is turned off with observation (MODELKV_OBSERVE=0)"

PagedKV = Callable[[], Iterable[torch.Tensor]]
"""The paged KV cache's tensors now (their storages are never discovered)."""


class CensusOwner:
    """A module's storages found by the census: live at the last census, and their high-waters."""

    __slots__ = ("path", "class_name", "live", "storages", "high_water", "interval_high_water")

    def __init__(self, path: str, class_name: str) -> None:
        self.path = path
        self.class_name = class_name
        self.live = 0
        self.storages = 0
        self.high_water = 0
        self.interval_high_water = 0


def _storage_count(records: Iterable[Any]) -> int:
    found: set[StorageKey] = set()
    for record in records:
        layer = record()
        if layer is not None:
            found.update(readable_storages(layer, record.plan))
    return len(found)


def _below(path: str, of: str) -> bool:
    """Whether module ``path`` lies inside module ``of``."""
    return path != of and (of == "" or path.startswith(of + "."))


_outside = OwnerState(OUTSIDE, object())
"""The owner of the layers no model's module was found for, whichever model's census places them later."""
_dropped = OwnerState(DROPPED, object())
"""The owner of the layers of a model whose discovery is off, beside other models' (weighed, never published)."""
_burst = 0
_burst_frame = 0


def _cache_classes() -> tuple[type | None, type | None, frozenset[str]]:
    """``transformers``' ``CacheLayerMixin`` and ``Cache``, and the files whose frames build caches (the cache module's
    and ``copy``'s)."""
    try:
        from transformers import cache_utils
    except Exception:
        return None, None, frozenset({copy.__file__})
    files = frozenset({copy.__file__, cache_utils.__file__})
    return getattr(cache_utils, "CacheLayerMixin", None), getattr(cache_utils, "Cache", None), files


class Discovery:
    """One model's discovered owners. Built disabled (``reason``) when discovery is off."""

    def __init__(
        self,
        model: object,
        settings: DiscoverySettings,
        *,
        observer: Observer | None = None,
        declaring: Iterable[str] = (),
        reason: str | None = None,
    ) -> None:
        self.settings = settings
        self.budget = census.Budget(settings.census_max_modules, settings.census_max_objects, settings.census_max_depth)
        """What one census may visit at most, from ``settings``."""
        self.reason = reason
        self.declaring = frozenset(declaring)
        self.modules: ModuleMap | None = None
        self.layer_owners: dict[str, OwnerState] = {}
        self.census_owners: dict[str, CensusOwner] = {}
        self.layouts: dict[str, KVLayout | None] = {}
        self.baseline: set[int] = set()
        """Storage ids (``census.storage_id``) the modules held after load, parameters included: never discovered."""
        self.scratch = census.Scratch(self.budget)
        """The census's tables, reused from census to census."""
        self.paged: PagedKV | None = None
        self.ready = False
        self.last: census.CensusResult | None = None
        self.census_at: float | None = None
        self.census_seconds: float | None = None
        self.unpublished: set[str] = set()
        self.observer = observer
        self._observing = observer is not None and observer.enabled and observer.unavailable is None
        self._layer_class, self._cache_class, self._builder_files = _cache_classes()
        self._index: stack.CodeIndex[Discovery] | None = None
        self._logged: set[str] = set()
        if reason is not None:
            return
        try:
            root = unwrap_model(model)
            root = root if isinstance(root, torch.nn.Module) else None
            if root is None:
                self.reason = f"the model is a {type(model).__name__}, not a torch module: nothing to discover"
                return
            self.modules = ModuleMap(root)
            self._index = stack.CodeIndex([(self, self.modules)])
            self.take_baseline()
            if self._observing:
                _register(self)
        except Exception as error:
            self.fail("install", error)

    @property
    def enabled(self) -> bool:
        """Whether discovery runs (nothing has turned it off)."""
        return self.reason is None

    def fail(self, site: str, error: BaseException) -> None:
        """Something failed inside discovery: turn it off for good, keep the first cause, report it once.

        Safe on a model thread, under any lock, near the recursion limit: it logs nothing itself (``report``
        queues the line for the heartbeat thread). Never raises.
        """
        try:
            if getattr(hooks.discover, "__self__", None) is self:
                hooks.discover = None
            if self.reason is None:
                self.reason = f"discovery failed in {site}: {type(error).__name__}"
                self.reason = f"discovery failed in {site}: {type(error).__name__}: {error}"
            if site not in self._logged:
                self._logged.add(site)
                report(logger, "modelkv: discovery failed in %s; it is now off", site, error=error)
        except Exception:  # noqa: BLE001 - at the recursion limit even this path cannot call; discovery is off already
            self.reason = self.reason or "discovery failed"

    def take_baseline(self) -> None:
        """What the modules hold now (after load), parameters included: never discovered."""
        assert self.modules is not None
        result = census.run(census.census(self.modules, self.budget, parameters=True), pause=False)
        self.baseline = {storage for storage, _ in result.found.items()} | result.parameters

    def start(self, paged: PagedKV | None = None) -> None:
        """Initialisation is over: censuses may run from now on, the paged KV cache's storages excluded."""
        if paged is not None:
            self.paged = paged
        self.ready = True

    def uninstall(self) -> None:
        """Stop attributing layers (the records already made stay with the observer) and drop the paged cache's
        reader (it reaches the worker); other models' discovery goes on."""
        self.paged = None
        with _routing:
            if self in _attributing:
                _attributing.remove(self)
                _route()
            elif getattr(hooks.discover, "__self__", None) is self:
                hooks.discover = None

    def mapped(self) -> bool:
        """Whether this discovery's model takes part in the walk over several models: its module map built, its
        observer still installed, its model still loaded. One that failed still does: its model's layers must not
        go to another model's module of the same class; they are dropped (``DROPPED``)."""
        return (
            self._observing
            and self.modules is not None
            and self.modules.root is not None
            and self.observer is not None
            and self.observer.attached
        )

    # -- cache layers --------------------------------------------------------------------------

    def attribute(self, layer: object) -> tuple[OwnerState, int] | None:
        """The owner of a layer first seen while no declaring owner runs, and the group of its cache (0: unknown).

        Called by the hooks, once a layer, on the model's thread. Never raises: at the recursion limit, or when
        anything else fails, it returns None and discovery is off.
        """
        try:
            return self._attribute(layer)
        except Exception as error:
            try:
                self.fail("cache layer attribution", error)
            except Exception:  # noqa: BLE001 - no call is possible here; assignments are
                hooks.discover = None
                self.reason = self.reason or "discovery failed in cache layer attribution"
            return None

    def _attribute(self, layer: object) -> tuple[OwnerState, int] | None:
        """Walk the stack outward, by code alone, to the innermost module that is not only handed the cache
        (``stack.innermost``).

        A frame names a module when its code is a method of a class only that module has (``ModuleMap.codes``).
        Modules whose method takes ``past_key_values`` only pass the cache along, so the walk goes on outward to
        the module that made or keeps it. Without any, the layer is held ``OUTSIDE`` and a census gives it to the
        innermost module that holds it. A layer ``copy.copy`` makes shares every tensor with the layer it copies:
        it is left alone (None), so that its original's bytes are not counted twice.

        The group (layers of one cache, for the layout) is the run of layers built within one outermost frame
        of the cache module or ``copy`` (a cache's ``__init__``, ``update``, or a ``deepcopy``); a census that
        reaches the cache object sets it exactly.
        """
        index = self._index
        assert self.modules is not None and index is not None
        if self.settings.discover_read_locals:
            return _by_locals(((self, self.modules),), self._cache_class, sys._getframe(2))
        return _placed(stack.innermost(index, self._builder_files, sys._getframe(2)))

    def _owner(self, path: str, module: object) -> OwnerState:
        observed = self.observer.state_of(module) if self.observer is not None else None
        if observed is not None:
            return observed
        state = self.layer_owners.get(path)
        if state is None:
            state = self.layer_owners[path] = OwnerState(path, module)
        return state

    # -- sampling ------------------------------------------------------------------------------

    def census(self) -> None:
        """Run the census when it is due (on the heartbeat thread, outside the publisher's lock: it yields). Never raises."""
        if self.reason is None and self.ready and not hooks.capturing() and self._census_due():
            try:
                self._census()
            except Exception as error:
                self.fail("census", error)

    def sample(self, observations: Sequence[Observation] = ()) -> tuple[tuple[DiscoveredOwner, ...], DiscoveryStatus]:
        """Every discovered owner's figures now, and the start of the next interval. Never raises.

        ``observations`` are the observer's figures of the same beat: an observed owner that declares
        nothing (its ``model_local_kv_specs()`` is empty) is a discovered owner too, with those figures.
        """
        owners: list[DiscoveredOwner] = []
        if self.reason is None:
            try:
                owners = self._figures(observations)
            except Exception as error:
                self.fail("sample", error)
        if self.reason is not None:
            return (), DiscoveryStatus(enabled=False, reason=self.reason)
        published, below, over = self._publishable(owners)
        last = self.last
        return published, DiscoveryStatus(
            enabled=True,
            census_at=self.census_at,
            census_seconds=self.census_seconds,
            modules=last.modules if last else 0,
            objects=last.objects if last else 0,
            budget_exhausted=last.exhausted if last else None,
            census_skipped=dict(last.skipped) if last else None,
            owners_below_floor=below,
            owners_over_budget=over,
        )

    def beat(self) -> tuple[tuple[DiscoveredOwner, ...], DiscoveryStatus]:
        """``census`` then ``sample`` (without observations): for callers that sample nothing else."""
        self.census()
        return self.sample()

    def _census_due(self) -> bool:
        return self.census_at is None or time.time() - self.census_at >= self.settings.census_interval

    def _census(self) -> None:
        assert self.modules is not None
        began = time.perf_counter()
        result = census.run(
            census.census(
                self.modules,
                self.budget,
                known=self.baseline,
                layer_class=self._layer_class,
                cache_class=self._cache_class,
                scratch=self.scratch,
            )
        )
        self._place_layers(result)
        result.leave_out(self._paged_storages() | self._layer_storages() | result.parameters)
        self._count_found(result)
        census.finish(census.release(result))
        self.last = result
        self.census_at = time.time()
        self.census_seconds = time.perf_counter() - began

    def _count_found(self, result: CensusResult) -> None:
        """Each module's new storages, as the census summed them, become its census owner's figures."""
        assert self.modules is not None
        for owner in self.census_owners.values():
            owner.live, owner.storages = 0, 0
        entries = self.modules.modules
        for index, size, count in result.by_owner():
            path, reference = entries[index]
            known = self.census_owners.get(path)
            owner = known or CensusOwner(path, type(reference()).__name__)
            self.census_owners[path] = owner
            owner.live, owner.storages = size, count
            owner.high_water = max(owner.high_water, size)
            owner.interval_high_water = max(owner.interval_high_water, size)

    def _place_layers(self, result: CensusResult) -> None:
        """What the census learnt of the cache layers it reached: the cache each belongs to (its group), and the
        innermost module that holds it, which becomes its owner where no module was found for it when it was first
        seen, or where it lies below the module found then (a cache each of several attention layers keeps is
        attributed, when built, to the module around them: their code is shared). Under ``hooks.lock`` a few records
        at a time."""
        if not result.layers or not self._observing:
            return
        with hooks.lock:
            records = list(hooks.records.values())
        moves = []
        for record in records:
            placed = result.placed(record.key)
            if placed is None or record() is None:
                continue
            index, group = placed
            if group:
                record.group = group
            owner = record.owner
            path, reference = self.modules.modules[index]  # type: ignore[union-attr]
            if owner is _outside or (owner is self.layer_owners.get(owner.path) and _below(path, owner.path)):
                module = reference()
                if module is not None:
                    moves.append((record, owner, self._owner(path, module)))
        for start in range(0, len(moves), CHUNK):
            with hooks.lock:
                for record, owner, state in moves[start : start + CHUNK]:
                    if record.owner is owner and record() is not None:
                        size = record.bytes
                        owner.live -= size
                        record.owner = state
                        state.add(size)
                        hooks.changed[id(record)] = record

    def _paged_storages(self) -> set[int]:
        weighed: dict[StorageKey, int] = {}
        for tensor in self.paged() if self.paged is not None else ():
            tensors.weigh(tensor, weighed)
        return census.storage_ids(weighed)

    def _layer_storages(self) -> set[int]:
        found: set[StorageKey] = set()
        with hooks.lock:
            records = list(hooks.records.values())
        for record in records:
            layer = record()
            if layer is not None and record.plan.unknown is None:
                found.update(held_storages(layer, record.plan))
        return census.storage_ids(found)

    def _figures(self, observations: Sequence[Observation]) -> list[DiscoveredOwner]:
        owners: list[DiscoveredOwner] = []
        if self._observing and hooks.broken() is None:
            with hooks.lock:
                records = list(hooks.records.values())
            by_owner: dict[int, list[LayerRecord]] = {}
            for record in records:
                by_owner.setdefault(id(record.owner), []).append(record)
            records = []
            for path, state in list(self.layer_owners.items()):
                mine = by_owner.get(id(state), [])
                live, failure, held = self._recount(state, mine)
                problem = failure or state.unknown or state.graph
                if problem is None:
                    self.layouts[path] = widest(self.layouts.get(path), seen_layout(mine))
                    owners.append(self._owner_figures(state, live, held, DiscoveryMethod.CACHE_LAYER))
                else:
                    self._unpublished(path, problem)
                state.interval_high_water = live
            owners += self._silent(observations, by_owner)
        for owner in self.census_owners.values():
            owners.append(self._owner_figures(owner, owner.live, owner.storages, DiscoveryMethod.CENSUS))
            owner.interval_high_water = owner.live
        return owners

    @staticmethod
    def _recount(state: OwnerState, records: list[LayerRecord]) -> tuple[int, str | None, int]:
        """``recount`` of an owner's layers (``tally.CHUNK`` records per hold of ``hooks.lock``): the live bytes,
        de-duplicated by storage, why they cannot be trusted, and the number of storages."""
        found: dict[StorageKey, int] = {}
        live, failure = recount(state, records, hooks.active(), found)
        return live, failure, len(found)

    def _silent(
        self, observations: Sequence[Observation], by_owner: Mapping[int, list[LayerRecord]]
    ) -> list[DiscoveredOwner]:
        """Observed owners that declare nothing, with their observed figures, merged with what was discovered there."""
        states = self.observer.owner_states() if self.observer is not None else {}
        found = []
        for observation in observations:
            path = observation.owner
            state = states.get(path)
            if path in self.declaring or state is None or not observation.available or observation.peak_bytes is None:
                continue
            if self.modules is None or self.modules.path_of(state.owner_ref()) != path:
                continue  # an owner of another model the observer also watches
            records = by_owner.get(id(state), [])
            self.layouts[path] = widest(self.layouts.get(path), seen_layout(records))
            found.append(
                DiscoveredOwner(
                    owner=path,
                    owner_class=observation.owner_class,
                    found_by=DiscoveryMethod.CACHE_LAYER.value,
                    peak_bytes=observation.peak_bytes,
                    recent_peak_bytes=observation.recent_peak_bytes or 0,
                    live_bytes=observation.live_bytes or 0,
                    declares=False,
                    storages=_storage_count(records),
                    layout=self.layouts[path],
                )
            )
        return found

    def _owner_figures(
        self, state: OwnerState | CensusOwner, live: int, storages: int, method: DiscoveryMethod
    ) -> DiscoveredOwner:
        return DiscoveredOwner(
            owner=state.path,
            owner_class=state.class_name,
            found_by=method.value,
            peak_bytes=state.high_water,
            recent_peak_bytes=state.interval_high_water,
            live_bytes=live,
            declares=state.path in self.declaring,
            storages=storages,
            layout=self.layouts.get(state.path) if method is DiscoveryMethod.CACHE_LAYER else None,
        )

    def _unpublished(self, path: str, problem: str) -> None:
        if path not in self.unpublished:
            self.unpublished.add(path)
            report(logger, "modelkv: the caches %s builds are not published: %s", path or "the root module", problem)

    def _publishable(self, owners: list[DiscoveredOwner]) -> tuple[tuple[DiscoveredOwner, ...], int, int]:
        above = [o for o in owners if o.peak_bytes >= self.settings.discover_floor_bytes]
        above.sort(key=lambda o: (-o.peak_bytes, o.owner, o.found_by))
        kept = above[: self.settings.engine_max_discovered_owners]
        kept.sort(key=lambda o: (o.owner, o.found_by))
        return tuple(kept), len(owners) - len(above), len(above) - len(kept)


class Several:
    """Attribution for several models in one process: one walk of the stack over every model's code
    (``stack.CodeIndex``), which gives a new layer to the model whose module is on the stack."""

    def __init__(self, discoveries: Sequence[Discovery]) -> None:
        self.discoveries = tuple(discoveries)
        self.models = tuple((found, found.modules) for found in discoveries if found.modules is not None)
        self.index = stack.CodeIndex(self.models)
        self.read_locals = any(found.settings.discover_read_locals for found in discoveries)
        """Whether to walk by the frames' locals: where any model's settings opted into it (the process pays)."""
        self._cache_class = discoveries[0]._cache_class
        self._builder_files = discoveries[0]._builder_files

    def attribute(self, layer: object) -> tuple[OwnerState, int] | None:
        """``Discovery.attribute`` for every model at once. Never raises: when anything fails, it returns None and
        discovery is off for every model (the walk is theirs together)."""
        try:
            if self.read_locals:
                return _by_locals(self.models, self._cache_class, sys._getframe(1))
            return _placed(stack.innermost(self.index, self._builder_files, sys._getframe(1)))
        except Exception as error:
            if getattr(hooks.discover, "__self__", None) is self:
                hooks.discover = None
            try:
                for found in self.discoveries:
                    found.fail("cache layer attribution", error)
            except Exception:  # noqa: BLE001 - no call is possible here; assignments are
                for found in self.discoveries:
                    found.reason = found.reason or "discovery failed in cache layer attribution"
            return None


_attributing: list[Discovery] = []
"""The discoveries that give new layers to their models' modules, oldest first."""
_routing = threading.Lock()
"""Held while ``_attributing`` and ``hooks.discover`` change (at load and at an engine's end; never on a model's
thread, which only reads ``hooks.discover``)."""


def _register(found: Discovery) -> None:
    """``found`` attributes new layers from now on, beside the other models' discovery (replacing an older discovery
    of the same model)."""
    root = found.modules.root if found.modules is not None else None
    with _routing:
        for older in list(_attributing):
            if older.modules is None or older.modules.root is root:
                _attributing.remove(older)
        _attributing.append(found)
        _route()


def _route() -> None:
    """Point the hooks at the models' discoveries: one directly (none once it failed), several through one walk
    (holding ``_routing``)."""
    _attributing[:] = [found for found in _attributing if found.mapped()]
    running = [found for found in _attributing if found.reason is None]
    if not running:
        hooks.discover = None
    elif len(_attributing) == 1:
        hooks.discover = _attributing[0].attribute
    else:
        hooks.discover = Several(_attributing).attribute


def _placed(walked: tuple[stack.Target[Discovery] | None, int] | None) -> tuple[OwnerState, int] | None:
    """The owner and group ``stack.innermost``'s result gives a layer: the module's model's owner there, ``DROPPED``
    where that model's discovery is off, or ``OUTSIDE``; None for a shallow copy (holding ``hooks.lock``, as every
    attribution does).

    The group is one number per outermost frame of the cache module or ``copy`` the layer was built below (0: none).
    """
    global _burst, _burst_frame
    if walked is None:
        return None
    target, builder = walked
    group = 0
    if builder:
        if builder != _burst_frame:
            _burst += 1
            _burst_frame = builder
        group = _burst
    if target is not None:
        path, reference, found = target
        if found.reason is not None:
            return _dropped, group
        module = reference()
        if module is not None:
            return found._owner(path, module), group
    return _outside, group


def _by_locals(
    models: Sequence[tuple[Discovery, ModuleMap]], cache_class: type | None, frame: Any
) -> tuple[OwnerState, int] | None:
    """The opt-in walk by the frames' locals (``locals_walk``), over one model or several."""
    found, cache = locals_walk.find(tuple(modules for _, modules in models), cache_class, frame)
    if found is None:
        return _outside, cache
    position, path, module = found
    discovery = models[position][0]
    if discovery.reason is not None:
        return _dropped, cache
    return discovery._owner(path, module), cache


def discover(model: object, config: HookConfig, observer: Observer | None, declaring: Iterable[str] = ()) -> Discovery:
    """Start discovering in ``model`` as ``config`` says (``config.discovery``); a disabled ``Discovery`` when off."""
    reason = None if config.observe else OBSERVE_OFF
    if reason is None and not config.discover:
        reason = OFF
    return Discovery(model, config.discovery, observer=observer, declaring=declaring, reason=reason)
