"""An engine's growth since its baseline, by part, judged as ``modelkv_engine:undeclared_memory_bytes`` judges it.

One definition for the landing page and ``inspect``, mirroring the rules of the ``modelkv.caches``
group (deploy/prometheus/modelkv-rules.yaml) for one snapshot:

- live tensors (``modelkv_engine:live_tensor_growth_bytes``): the larger of the floor of live
  tensors above the live tensors after initialisation and the high-water mark above its baseline
  (the live tensors then plus the activation peak vLLM profiled); the high-water figure alone
  where no floor is reported, else live tensors at the sample. The rule reads the floor as its
  lowest over 10 minutes; one snapshot holds its latest reading (the lowest of the engine's last two
  minutes), which is higher by what a leak added in those 10 minutes, never lower.
- non-torch (``modelkv_engine:non_torch_growth_bytes``): NVML's figure for the process less the
  caching allocator's growth. The rule also reads the device's used memory when the engine is alone
  on its device, which one snapshot cannot tell: without NVML it is not measured here.
- unplanned (``modelkv_engine:unplanned_growth_bytes``): the two added, each counted from 0; live
  tensors alone without a non-torch figure; resident memory for a CPU engine.
- explained (``modelkv_engine:cache_explained_bytes``): per declaring owner, what its caches held in
  the last interval where observed, else its declared peak; the most each owner that declares nothing
  but was discovered held recently. A CPU engine, whose resident memory keeps freed heap: per owner
  the larger of its declared peak and the most its caches ever held, and the most each discovered owner
  ever held.
- unexplained (``modelkv_engine:undeclared_memory_bytes``): unplanned less explained, from 0.

What grew, as parts that do not overlap and add up to the unplanned growth (``grown_parts``; an ended
engine's ``modelkv_engine_end_growth_bytes``): first what the model-local caches explain, then, of the
rest, memory outside torch and live tensors (a device engine) or resident memory (a host engine).

``ModelKVUndeclaredMemoryGrowth`` fires once unexplained growth stays above
``UNDECLARED_GROWTH_BYTES`` for 15 minutes (a CPU engine's only while it keeps rising).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from modelkv_exporter.contract.snapshot import Observation, Snapshot
from modelkv_exporter.contract.thresholds import UNDECLARED_GROWTH_BYTES
from modelkv_exporter.sidecar.discovered import discovery_running


@dataclass(frozen=True)
class Growth:
    """An engine's growth since its post-initialisation baseline, by part (None: not measured)."""

    live_tensors: int | None
    """Live tensors beyond what initialisation left (``live_tensor_growth_bytes``)."""
    non_torch: int | None
    """Device memory outside torch's caching allocator grown since the baseline (``non_torch_growth_bytes``)."""
    resident: int | None
    """Resident memory grown since the baseline: a CPU engine's figure, used only where no torch figure is."""
    explained: int
    """What the model-local caches explain (``cache_explained_bytes``)."""

    @property
    def resident_measured(self) -> bool:
        """Whether the engine is measured by resident memory (a CPU engine: no torch figures)."""
        return self.live_tensors is None and self.resident is not None

    @property
    def unplanned(self) -> int | None:
        """Growth that neither the memory profile nor the allocator's reuse explains (``unplanned_growth_bytes``)."""
        if self.live_tensors is not None:
            return max(self.live_tensors, 0) + max(self.non_torch or 0, 0)
        return self.resident

    @property
    def unexplained(self) -> int | None:
        """Unplanned growth the caches do not explain, from 0 (``undeclared_memory_bytes``)."""
        unplanned = self.unplanned
        return None if unplanned is None else max(unplanned - self.explained, 0)

    @property
    def over_threshold(self) -> bool:
        """Whether the unexplained growth is above the alert's threshold now."""
        return (self.unexplained or 0) > UNDECLARED_GROWTH_BYTES


GROWN_PARTS = ("model_local_caches", "live_tensors", "non_torch", "resident")
"""The parts ``grown_parts`` splits growth into (the ``part`` label of ``modelkv_engine_end_growth_bytes``)."""


def grown_parts(judged: Growth) -> dict[str, int]:
    """The unplanned growth split into parts that do not overlap and add up to it: what the model-local caches
    explain (at most the whole), then of the rest memory outside torch (at most the rest) and live tensors (a
    device engine), or resident memory (a host engine). Empty where no growth is measured."""
    unplanned = judged.unplanned
    if unplanned is None:
        return {}
    whole = max(unplanned, 0)
    caches = min(judged.explained, whole)
    rest = whole - caches
    if judged.live_tensors is None:
        return {"model_local_caches": caches, "resident": rest}
    non_torch = min(max(judged.non_torch or 0, 0), rest)
    parts = {"model_local_caches": caches, "live_tensors": rest - non_torch}
    if judged.non_torch is not None:
        parts["non_torch"] = non_torch
    return parts


def _difference(
    now: Mapping[str, int], base: Mapping[str, int], source: str, base_source: str | None = None
) -> int | None:
    base_source = base_source or source
    if source in now and base_source in base:
        return now[source] - base[base_source]
    return None


def live_tensor_growth(now: Mapping[str, int], base: Mapping[str, int]) -> int | None:
    """``modelkv_engine:live_tensor_growth_bytes`` of one sample against its baseline."""
    floor = _difference(now, base, "torch_allocated_low_water", "torch_allocated")
    high = _difference(now, base, "torch_allocated_high_water")
    if floor is not None and high is not None:
        return max(floor, high)
    for figure in (high, floor):
        if figure is not None:
            return figure
    return _difference(now, base, "torch_allocated")


def _non_torch_growth(now: Mapping[str, int], base: Mapping[str, int]) -> int | None:
    process = _difference(now, base, "process_gpu")
    reserved = _difference(now, base, "torch_reserved")
    return None if process is None or reserved is None else process - reserved


def _owner_explained(snapshot: Snapshot, owner: str, observation: Observation | None, keeps_heap: bool) -> int | None:
    declared = snapshot.declared_peak_of(owner) if any(d.owner == owner for d in snapshot.declarations) else None
    observed = None
    if observation is not None and observation.available:
        observed = observation.peak_bytes if keeps_heap else observation.recent_peak_bytes
    if keeps_heap:
        figures = [f for f in (observed, declared) if f is not None]
        return max(figures) if figures else None
    return observed if observed is not None else declared


def cache_explained(snapshot: Snapshot, resident_measured: bool) -> int:
    """``modelkv_engine:cache_explained_bytes`` of one snapshot (every discovered owner, however many the sidecar's
    budget exports)."""
    per_owner: dict[str, int] = {}
    for owner, observation in snapshot.owners().items():
        explained = _owner_explained(snapshot, owner, observation, resident_measured)
        if explained is not None:
            per_owner[owner] = explained
    discovered: dict[str, int] = {}
    for found in snapshot.discovered if discovery_running(snapshot) else ():
        if not found.declares:
            held = found.peak_bytes if resident_measured else found.recent_peak_bytes
            discovered[found.owner] = max(discovered.get(found.owner, 0), held)
    for owner, held in discovered.items():
        per_owner.setdefault(owner, held)
    return sum(per_owner.values())


def growth(snapshot: Snapshot) -> Growth | None:
    """The engine's growth by part, judged as the rules judge it; None before its baseline or without a sample."""
    current, baseline = snapshot.measured.current, snapshot.measured.baseline
    if current is None or baseline is None:
        return None
    now, base = current.values, baseline.values
    live = live_tensor_growth(now, base)
    resident = _difference(now, base, "process_resident")
    measured_by_resident = live is None and "device_used" not in now and resident is not None
    return Growth(
        live_tensors=live,
        non_torch=_non_torch_growth(now, base) if live is not None else None,
        resident=resident,
        explained=cache_explained(snapshot, measured_by_resident),
    )
