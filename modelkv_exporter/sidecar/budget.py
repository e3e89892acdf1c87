"""What the sidecar admits from the spool, so that no file can make it run out of memory or export wrong data.

Per snapshot, checked once per file version as the reader parses it (``Admission.check``):
at most ``max_declarations`` declarations (and as many entries of dropped declarations), at most ``max_label_bytes`` bytes of label values
over all the series it exports, and no two of its series with the same labels once the
label values are sanitised. Per scrape, checked on every new scan (``Admission.admit``):
engines in file-name order until ``max_series`` series or ``max_scrape_label_bytes`` bytes of
label values; a later engine whose sanitised engine label equals an earlier one's is a duplicate. A snapshot outside its budget is rejected as
``over_budget`` (a collision as ``invalid_snapshot`` or ``duplicate_engine``) and counted once
per file version; every other engine is still exported.

Discovered owners are not a reason to reject: an engine's series carry at most ``sidecar_max_discovered_owners`` of
them (the largest, ``sidecar.discovered``), and the others are counted in
``modelkv_discovery_owners_omitted{reason="exporter_budget"}``.

Series and label bytes are counted by the same sample functions that render /metrics, for a
fresh engine (a stale one exports fewer), so the budget is what a scrape really carries.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from modelkv_exporter.contract.setting_values import byte_size, positive_int
from modelkv_exporter.contract.settings import setting
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.sidecar.labels import engine_labels
from modelkv_exporter.sidecar.reader.decode import RejectReason, SnapshotError
from modelkv_exporter.sidecar.reader.scan import SpoolEntry, SpoolReader, SpoolScan
from modelkv_exporter.sidecar.samples import engine_samples


@dataclass(frozen=True)
class Budget:
    """The limits one sidecar admits the spool within; each a setting (``docs/reliability.md`` measures the
    memory they bound against the sidecar's 192 MiB limit in ``deploy/kubernetes``)."""

    max_declarations: int = setting(
        256,
        positive_int,
        "A snapshot with more declarations, or more entries of dropped declarations, is rejected (over_budget).",
    )
    """Real models declare a few: one per cache-owning module class."""

    sidecar_max_discovered_owners: int = setting(
        64,
        positive_int,
        "Discovered owners the sidecar exports per engine, the largest by peak; the others are counted in "
        'modelkv_discovery_owners_omitted{reason="exporter_budget"}, not exported. Each engine publishes at most '
        "MODELKV_ENGINE_MAX_DISCOVERED_OWNERS itself.",
    )
    """A model has a few, each three series. An engine's own owner budget and size floor come first; this bounds
    what a writer that ignores them costs."""

    max_label_bytes: int = setting(
        256 * 1024,
        byte_size,
        "A snapshot whose series carry more bytes of label values in all is rejected (over_budget).",
    )
    max_series: int = setting(
        10_000,
        positive_int,
        "Series of all engines in one scrape; engines, in file-name order, that would pass it are rejected "
        "(over_budget).",
    )
    """The exporter's own series come on top."""

    max_scrape_label_bytes: int = setting(
        4 * 1024 * 1024,
        byte_size,
        "Bytes of label values of all engines in one scrape; engines, in file-name order, that would pass it are "
        "rejected (over_budget).",
    )


@dataclass(frozen=True)
class Cost:
    """What one fresh engine's snapshot adds to a scrape."""

    series: int
    label_bytes: int


def snapshot_cost(snapshot: Snapshot, max_discovered: int) -> Cost:
    """The series and label bytes ``snapshot`` exports when fresh (its snapshot age included), with at most
    ``max_discovered`` of its discovered owners.

    Raises ``SnapshotError`` (``invalid_snapshot``) when two of its series carry the same labels
    once sanitised: Prometheus would keep one of them, and an OpenMetrics parser would refuse the body.
    """
    seen: set[tuple[str, tuple[str, ...]]] = set()
    label_bytes = 0

    def add(name: str, values: list[str], value: float) -> None:
        nonlocal label_bytes
        key = (name, tuple(values))
        if key in seen:
            raise SnapshotError(
                RejectReason.INVALID_SNAPSHOT, f"two {name} series have the labels {list(values)!r} once sanitised"
            )
        seen.add(key)
        label_bytes += sum(len(v.encode()) for v in values)

    def info(name: str, values: list[str]) -> None:
        add(name, values, 1.0)

    engine_samples(snapshot, False, add, info, max_discovered)
    add("modelkv_engine_snapshot_age_seconds", engine_labels(snapshot), 0.0)
    return Cost(len(seen), label_bytes)


@dataclass
class Admission:
    """Applies a ``Budget`` to one reader's scans. Thread-safe."""

    budget: Budget = field(default_factory=Budget)
    _costs: dict[tuple[str, int], Cost] = field(default_factory=dict)
    _counted: set[tuple[str, int]] = field(default_factory=set)
    _last: tuple[SpoolScan, SpoolScan] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, snapshot: Snapshot) -> None:
        """The per-snapshot budget: the reader's ``admit`` hook. Raises ``SnapshotError`` to reject."""
        count = len(snapshot.declarations)
        if count > self.budget.max_declarations:
            raise SnapshotError(
                RejectReason.OVER_BUDGET, f"{count} declarations > limit {self.budget.max_declarations}"
            )
        dropped = len(snapshot.dropped_declarations or ())
        if dropped > self.budget.max_declarations:
            raise SnapshotError(
                RejectReason.OVER_BUDGET,
                f"{dropped} entries of dropped declarations > limit {self.budget.max_declarations}",
            )
        cost = snapshot_cost(snapshot, self.budget.sidecar_max_discovered_owners)
        if cost.label_bytes > self.budget.max_label_bytes:
            raise SnapshotError(
                RejectReason.OVER_BUDGET,
                f"{cost.label_bytes} bytes of label values > limit {self.budget.max_label_bytes}",
            )

    def admit(self, scan: SpoolScan, reader: SpoolReader) -> SpoolScan:
        """``scan`` with the engines past the scrape's series budget, and later engines whose sanitised
        engine label repeats an earlier one, turned into rejected entries (counted in ``reader``).

        The same scan object gives the same admitted scan object, so a view of an unchanged spool is reused.
        """
        with self._lock:
            if self._last is not None and self._last[0] is scan:
                return self._last[1]
            costs: dict[tuple[str, int], Cost] = {}
            owners: dict[str, str] = {}
            series = label_bytes = 0
            entries: list[SpoolEntry] = []
            rejected: dict[tuple[str, int], RejectReason] = {}
            for entry in scan.entries:
                snapshot = entry.snapshot
                if snapshot is None:
                    entries.append(entry)
                    continue
                key = (entry.file_name, entry.version)
                cost = costs[key] = self._costs.get(key) or snapshot_cost(
                    snapshot, self.budget.sidecar_max_discovered_owners
                )
                engine = engine_labels(snapshot)[0]
                error = None
                if engine in owners:
                    error = SnapshotError(
                        RejectReason.DUPLICATE_ENGINE, f"same engine label as {owners[engine]} once sanitised"
                    )
                elif series + cost.series > self.budget.max_series:
                    error = SnapshotError(
                        RejectReason.OVER_BUDGET,
                        f"its {cost.series} series would take the scrape past {self.budget.max_series} series",
                    )
                elif label_bytes + cost.label_bytes > self.budget.max_scrape_label_bytes:
                    error = SnapshotError(
                        RejectReason.OVER_BUDGET,
                        f"its {cost.label_bytes} bytes of label values would take the scrape past "
                        f"{self.budget.max_scrape_label_bytes}",
                    )
                if error is None:
                    owners[engine] = entry.file_name
                    series += cost.series
                    label_bytes += cost.label_bytes
                    entries.append(entry)
                else:
                    entries.append(SpoolEntry(entry.file_name, entry.mtime, error=error, version=entry.version))
                    rejected[key] = error.reason
            self._costs = costs
            fresh = [reason for key, reason in rejected.items() if key not in self._counted]
            self._counted = set(rejected)
        for reason in fresh:
            reader.count(reason)
        admitted = replace(scan, entries=tuple(entries))
        with self._lock:
            self._last = (scan, admitted)
        return admitted
