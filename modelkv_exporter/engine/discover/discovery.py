"""``Discovery``: the modules that hold caches they do not declare, and the figures published for them.

Two ways of finding them (``contract.vocabulary.DiscoveryMethod``):

- ``cache_layer``: a ``transformers`` cache layer created, copied or first used while no declaring
  owner runs belongs to the innermost module of the model on the call stack, looked up once, when
  the layer is first seen (``hooks.discover``). From then on it is weighed exactly as a declaring
  owner's layers are (``observe``'s records, re-weighed at every sample).
- ``census``: at load, the storages reachable from the modules are the baseline; every
  ``census_interval`` the heartbeat thread walks them again (``census``), and storages that are
  not parameters, not in the baseline, not the paged KV cache and not behind an observed cache
  layer belong to the innermost module that holds them.

Whatever fails inside discovery is logged once and turns discovery off; the model never sees it.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

import torch

from modelkv_exporter.contract.snapshot import DiscoveredOwner, DiscoveryStatus, KVLayout, Observation
from modelkv_exporter.contract.vocabulary import DiscoveryMethod
from modelkv_exporter.engine.discover import census
from modelkv_exporter.engine.discover.layout import seen_layout, widest
from modelkv_exporter.engine.discover.modules import MAX_FRAMES, ModuleMap
from modelkv_exporter.engine.log import get_logger
from modelkv_exporter.engine.observe import Observer, hooks
from modelkv_exporter.engine.observe.layers import StorageKey, storages
from modelkv_exporter.engine.observe.observer import records_by_owner, recount
from modelkv_exporter.engine.observe.records import LayerRecord, OwnerState
from modelkv_exporter.engine.protocol import unwrap_model

logger = get_logger("discover")

OUTSIDE = "<outside the model>"
"""Where layers go that no module of the model built: held, weighed, never published."""
OFF = "discovery is turned off (MODELKV_DISCOVER=0)"
OBSERVE_OFF = "discovery is turned off with observation (MODELKV_OBSERVE=0)"

PagedKV = Callable[[], Iterable[torch.Tensor]]
"""The paged KV cache's tensors now (their storages are never discovered)."""


@dataclass(frozen=True)
class DiscoverySettings:
    """How discovery runs: the engine's settings (``engine.config.HookConfig``) that concern it."""

    census_interval: float = 30.0
    floor_bytes: int = 1 << 20
    max_owners: int = 32
    budget: census.Budget = census.Budget(modules=100_000, objects=500_000, depth=8)

    @classmethod
    def of(cls, config: Any) -> DiscoverySettings:
        """From a ``HookConfig``."""
        return cls(
            census_interval=config.census_interval,
            floor_bytes=config.discover_floor_bytes,
            max_owners=config.discover_max_owners,
            budget=census.Budget(config.census_max_modules, config.census_max_objects, config.census_max_depth),
        )


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


def _cache_class() -> type | None:
    try:
        from transformers.cache_utils import Cache
    except Exception:
        return None
    return Cache


_RECONSTRUCT = getattr(getattr(sys.modules.get("copy"), "_reconstruct", None), "__code__", None)


def _storage_count(records: Iterable[Any]) -> int:
    found: set[StorageKey] = set()
    for record in records:
        layer = record()
        if layer is not None:
            found.update(storages(layer, record.plan.attributes))
    return len(found)


CACHE_SLOTS = frozenset({"past_key_values", "past_key_value"})
"""Argument names through which ``transformers`` models are handed a cache, or build one and return it when empty."""


def _handed(code: CodeType, local: Mapping[str, Any], cache: object) -> bool:
    """Whether a frame was handed ``cache`` in one of its arguments (``*args`` and ``**kwargs`` one level in), or an
    empty cache slot (``past_key_values=None``) that it fills with a cache it returns to its caller."""
    count = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames
    for name in names[1:count]:
        value = local.get(name)
        if value is cache or (value is None and name in CACHE_SLOTS):
            return True
    extra = count
    if code.co_flags & inspect.CO_VARARGS:
        if any(item is cache for item in local.get(names[extra], ())):
            return True
        extra += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        keywords = local.get(names[extra])
        if isinstance(keywords, dict):
            for name, value in keywords.items():
                if value is cache or (value is None and name in CACHE_SLOTS):
                    return True
    return False


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
        self.reason = reason
        self.declaring = frozenset(declaring)
        self.modules: ModuleMap | None = None
        self.layer_owners: dict[str, OwnerState] = {}
        self.census_owners: dict[str, CensusOwner] = {}
        self.layouts: dict[str, KVLayout | None] = {}
        self.baseline: set[StorageKey] = set()
        self.paged: PagedKV | None = None
        self.ready = False
        self.last: census.CensusResult | None = None
        self.census_at: float | None = None
        self.census_seconds: float | None = None
        self.unpublished: set[str] = set()
        self.observer = observer
        self._observing = observer is not None and observer.enabled and observer.unavailable is None
        self._outside = OwnerState(OUTSIDE, object())
        self._cache = _cache_class()
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
            self.take_baseline()
            if self._observing:
                hooks.discover = self.attribute
        except Exception as error:
            self.fail("install", error)

    @property
    def enabled(self) -> bool:
        """Whether discovery runs (nothing has turned it off)."""
        return self.reason is None

    def fail(self, site: str, error: BaseException) -> None:
        """Something failed inside discovery: turn it off for good, keep the first cause, log it once."""
        if self.reason is None:
            self.reason = f"discovery failed in {site}: {type(error).__name__}: {error}"
        if hooks.discover == self.attribute:
            hooks.discover = None
        if site not in self._logged:
            self._logged.add(site)
            logger.warning("modelkv: discovery failed in %s; it is now off", site, exc_info=error)

    def take_baseline(self) -> None:
        """What the modules hold now (after load), parameters included: never discovered."""
        assert self.modules is not None
        result = census.run(census.census(self.modules, self.settings.budget, parameters=True), pause=False)
        self.baseline = set(result.found) | result.parameters

    def start(self, paged: PagedKV | None = None) -> None:
        """Initialisation is over: censuses may run from now on, the paged KV cache's storages excluded."""
        if paged is not None:
            self.paged = paged
        self.ready = True

    def uninstall(self) -> None:
        """Stop attributing layers (the records already made stay with the observer)."""
        if hooks.discover == self.attribute:
            hooks.discover = None

    # -- cache layers --------------------------------------------------------------------------

    def attribute(self, layer: object) -> tuple[OwnerState, int] | None:
        """The owner of a layer first seen while no declaring owner runs, and the ``id`` of its cache (0: unknown).

        Called by the hooks, once a layer.
        """
        try:
            return self._attribute(layer)
        except Exception as error:
            self.fail("cache layer attribution", error)
            return None

    def _attribute(self, layer: object) -> tuple[OwnerState, int]:
        """Walk the stack outward: the cache the layer belongs to, then the module that built or holds it.

        That module is the innermost one on the stack that was not handed the cache as an argument:
        attention layers, decoder layers and transformer stacks that only pass the cache along (and
        build its layers lazily as they do), or build it in an empty ``past_key_values`` slot and
        return it, lead outward to the module that made it or keeps it. Without a cache to follow, or
        when every module was handed it, the innermost module.
        """
        modules = self.modules
        assert modules is not None
        frame: FrameType | None = sys._getframe(2)
        cache_type = self._cache
        cache: object = None
        innermost: tuple[str, object] | None = None
        for _ in range(MAX_FRAMES):
            if frame is None:
                break
            code = frame.f_code
            if code is _RECONSTRUCT:
                built = frame.f_locals.get("y")
                if cache is None and cache_type is not None and isinstance(built, cache_type):
                    cache = built
            elif code.co_argcount and code.co_varnames[0] == "self":
                local = frame.f_locals
                obj = local.get("self")
                path = modules.path_of(obj)
                if path is not None:
                    if cache is None or not _handed(code, local, cache):
                        return self._owner(path, obj), id(cache) if cache is not None else 0
                    innermost = innermost or (path, obj)
                elif cache is None and cache_type is not None and isinstance(obj, cache_type):
                    cache = obj
            frame = frame.f_back
        group = id(cache) if cache is not None else 0
        if innermost is not None:
            return self._owner(*innermost), group
        return self._outside, group

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
        result = census.run(census.census(self.modules, self.settings.budget))
        excluded = self.baseline | self._paged_storages() | self._layer_storages()
        sizes: dict[int, int] = {}
        counts: dict[int, int] = {}
        for storage, (index, size) in result.found.items():
            if storage not in excluded:
                sizes[index] = sizes.get(index, 0) + size
                counts[index] = counts.get(index, 0) + 1
        for owner in self.census_owners.values():
            owner.live, owner.storages = 0, 0
        entries = self.modules.modules
        for index, size in sizes.items():
            path, reference = entries[index]
            known = self.census_owners.get(path)
            owner = known or CensusOwner(path, type(reference()).__name__)
            self.census_owners[path] = owner
            owner.live, owner.storages = size, counts[index]
            owner.high_water = max(owner.high_water, size)
            owner.interval_high_water = max(owner.interval_high_water, size)
        self.last = result
        self.census_at = time.time()
        self.census_seconds = time.perf_counter() - began

    def _paged_storages(self) -> set[StorageKey]:
        found: set[StorageKey] = set()
        for tensor in self.paged() if self.paged is not None else ():
            known = census.storage_key(tensor)
            if known is not None:
                found.add(known[0])
        return found

    def _layer_storages(self) -> set[StorageKey]:
        found: set[StorageKey] = set()
        with hooks.lock:
            records = list(hooks.records.values())
        for record in records:
            layer = record()
            if layer is not None and record.plan.unknown is None:
                found.update(storages(layer, record.plan.attributes))
        return found

    def _figures(self, observations: Sequence[Observation]) -> list[DiscoveredOwner]:
        owners: list[DiscoveredOwner] = []
        if self._observing and hooks.broken() is None:
            with hooks.lock:
                by_owner = records_by_owner()
                for path, state in list(self.layer_owners.items()):
                    records = by_owner.get(id(state), [])
                    live, failure = recount(state, records, hooks.active())
                    problem = failure or state.unknown or state.graph
                    if problem is None:
                        self.layouts[path] = widest(self.layouts.get(path), seen_layout(records))
                        held = _storage_count(records)
                        owners.append(self._owner_figures(state, live, held, DiscoveryMethod.CACHE_LAYER))
                    else:
                        self._unpublished(path, problem)
                    state.interval_high_water = live
                owners += self._silent(observations, by_owner)
        for owner in self.census_owners.values():
            owners.append(self._owner_figures(owner, owner.live, owner.storages, DiscoveryMethod.CENSUS))
            owner.interval_high_water = owner.live
        return owners

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
            logger.warning("modelkv: the caches %s builds are not published: %s", path or "the root module", problem)

    def _publishable(self, owners: list[DiscoveredOwner]) -> tuple[tuple[DiscoveredOwner, ...], int, int]:
        above = [o for o in owners if o.peak_bytes >= self.settings.floor_bytes]
        above.sort(key=lambda o: (-o.peak_bytes, o.owner, o.found_by))
        kept = above[: self.settings.max_owners]
        kept.sort(key=lambda o: (o.owner, o.found_by))
        return tuple(kept), len(owners) - len(above), len(above) - len(kept)


def discover(model: object, config: Any, observer: Observer | None, declaring: Iterable[str] = ()) -> Discovery:
    """Start discovering in ``model`` as ``config`` (a ``HookConfig``) says; a disabled ``Discovery`` when off.

    Never raises: a failure is the returned discovery's ``reason``.
    """
    try:
        settings = DiscoverySettings.of(config)
    except Exception as error:
        off = Discovery(model, DiscoverySettings(), reason="unreadable settings")
        off.fail("settings", error)
        return off
    reason = None if config.observe else OBSERVE_OFF
    if reason is None and not config.discover:
        reason = OFF
    return Discovery(model, settings, observer=observer, declaring=declaring, reason=reason)
