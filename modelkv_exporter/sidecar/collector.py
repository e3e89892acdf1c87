"""A prometheus_client collector over the spool: fresh families from the snapshots on every collect.

The sidecar serves /metrics from ``exposition.cache`` instead, which renders the same samples
once per spool change; this collector is the reference the tests compare it with, and what
to register in another process's prometheus_client registry.

A bad file never fails the collect: it is skipped and counted. An engine whose snapshot is
marked ended disappears, but for its end where it died (``sidecar.post_mortem``); one whose heartbeat
is stale keeps only its identity and ``modelkv_engine_up 0`` (its memory is gone with it), and its end
too where it vanished.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any, cast

from prometheus_client.metrics_core import Metric as Family

from modelkv_exporter.sidecar.catalogue import CATALOGUE
from modelkv_exporter.sidecar.labels import engine_labels
from modelkv_exporter.sidecar.reader.state import LIVE_STATES, snapshot_age
from modelkv_exporter.sidecar.samples import exporter_samples, refusal_samples, shown_samples
from modelkv_exporter.sidecar.source import SpoolSource


class SpoolCollector:
    """A ``prometheus_client`` collector that exports the spool's snapshots."""

    def __init__(self, source: SpoolSource, refusals: Mapping[str, int] | None = None) -> None:
        self.source = source
        self.refusals = refusals

    def describe(self) -> list[Family]:
        """Nothing up front: families depend on the spool, so registration does not scrape."""
        return []

    def collect(self) -> Iterator[Family]:
        """Read the spool and yield every non-empty family for this collect."""
        started = time.perf_counter()
        families = {name: metric.family() for name, metric in CATALOGUE.items()}

        def add(name: str, labels: list[str], value: float) -> None:
            cast(Any, families[name]).add_metric(labels, value)

        def info(name: str, labels: list[str]) -> None:
            metric = CATALOGUE[name]
            cast(Any, families[name]).add_metric(labels, dict(zip(metric.labels, labels, strict=True)))

        view = self.source.view()
        limit = self.source.budget.sidecar_max_discovered_owners
        for item in view.shown:
            shown_samples(item.snapshot, item.state, add, info, limit)
            if item.state in LIVE_STATES:
                add(
                    "modelkv_engine_snapshot_age_seconds",
                    engine_labels(item.snapshot),
                    snapshot_age(item.snapshot, view.now),
                )
        exporter_samples(view.scan.ok, view.counts, self.source.reader.rejections, add, info)
        add("modelkv_exporter_collect_duration_seconds", [], time.perf_counter() - started)
        if self.refusals is not None:
            refusal_samples(self.refusals, add)
        return (family for family in families.values() if family.samples)
