"""The metric catalogue: every metric this exporter can emit, in one table.

The collector and the exposition cache build their families from these entries,
``docs/metrics.md`` is generated from them, and the dashboards and rules are tested against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from modelkv_exporter.contract.vocabulary import MEASUREMENTS
from modelkv_exporter.sidecar.breakdown import COMPONENT_NAMES
from modelkv_exporter.sidecar.growth import GROWN_PARTS
from modelkv_exporter.sidecar.reader.state import EngineState

Kind = Literal["gauge", "counter", "info"]
Family = GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily
UNITS = ("bytes", "seconds")
"""Base units a family's name can end in; OpenMetrics states them in a ``# UNIT`` line."""

ENGINE = ("engine", "model", "stage")
DECLARATION = (*ENGINE, "owner", "cache", "scope", "rows")
OWNER = (*ENGINE, "owner")
DISCOVERED = (*OWNER, "found_by")


@dataclass(frozen=True)
class Metric:
    """One metric: its full exposed name, type, meaning and label names."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    group: str

    @property
    def family_name(self) -> str:
        """The name prometheus_client's family classes take (without ``_total``/``_info``)."""
        if self.kind == "counter":
            return self.name.removesuffix("_total")
        if self.kind == "info":
            return self.name.removesuffix("_info")
        return self.name

    @property
    def unit(self) -> str:
        """The base unit the family's name ends in (``bytes``, ``seconds``), or "" for none."""
        return next((unit for unit in UNITS if self.family_name.endswith(f"_{unit}")), "")

    def family(self) -> Family:
        """A fresh, empty family for one scrape."""
        if self.kind == "counter":
            return CounterMetricFamily(self.family_name, self.help, labels=self.labels, unit=self.unit)
        if self.kind == "info":
            return InfoMetricFamily(self.family_name, self.help, labels=self.labels)
        return GaugeMetricFamily(self.family_name, self.help, labels=self.labels, unit=self.unit)


_D, _E, _M, _X = "Declarations", "Engines", "Measured memory", "Exporter health"
_O = "Observed caches"
_N = "Engine ends"
_U = "Discovered caches"

_METRICS: list[Metric] = [
    Metric(
        "modelkv_declared_peak_bytes",
        "gauge",
        "Declared peak bytes of one model-local KV cache at the engine's max_num_seqs.",
        DECLARATION,
        _D,
    ),
    Metric(
        "modelkv_declared_row_size_bytes",
        "gauge",
        "Declared bytes of one batch row of one model-local KV cache.",
        DECLARATION,
        _D,
    ),
    Metric(
        "modelkv_declared_rows",
        "gauge",
        "Rows of one model-local KV cache live at peak (fixed count or max_num_seqs).",
        DECLARATION,
        _D,
    ),
    Metric(
        "modelkv_declared_capacity_positions",
        "gauge",
        "Positions one row of a model-local KV cache can physically hold.",
        DECLARATION,
        _D,
    ),
    Metric(
        "modelkv_declaration_info",
        "info",
        "Geometry, dtype and diagnostic notes of one declaration (strings cut to 128 characters).",
        # model and stage came later: appended, so no existing label moved.
        (
            "engine",
            "owner",
            "cache",
            "dtype",
            "geometry",
            "capacity_source",
            "rows_reason",
            "allocation_note",
            "model",
            "stage",
        ),  # fmt: skip
        _D,
    ),
    Metric(
        "modelkv_declarations_dropped",
        "gauge",
        "Declarations of one owner the engine could not publish, by reason (declarer_raised, unresolvable_spec).",
        (*ENGINE, "owner", "reason"),
        _D,
    ),
    Metric(
        "modelkv_engine_info",
        "info",
        "Identity of one engine process that publishes declarations.",
        ("engine", "model", "stage", "architecture", "replica", "ranks", "device", "writer"),
        _E,
    ),
    Metric(
        "modelkv_engine_declarations",
        "gauge",
        "Number of model-local KV caches the engine's model declares (0 when none).",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_max_num_seqs",
        "gauge",
        "The engine's max_num_seqs, at which MAX_NUM_SEQS declarations are resolved (absent when it has none).",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_declared_per_sequence_bytes",
        "gauge",
        "Declared bytes one more in-flight sequence adds (row sizes of MAX_NUM_SEQS declarations).",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_gpu_memory_utilization_ratio",
        "gauge",
        "The share of the device the engine sizes itself to: vLLM 0.34's resolved gpu_memory_utilization, else the "
        "setting (absent when unknown).",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_torch_headroom_bytes",
        "gauge",
        "Device bytes vLLM 0.34 keeps free for torch when it sizes its extensible KV cache (the larger of its "
        "activation peak and torch's reserve growth); absent for other engines.",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_prescribed_kv_cache_bytes",
        "gauge",
        "The KV cache memory to give vLLM (--kv-cache-memory-bytes) so that the engine fits its requested memory: the "
        "requested memory less every measured part, the activation allowance and the model-local caches at "
        "max_num_seqs, less a 2 % margin (docs/prescription.md); negative when even no KV cache fits, absent when a "
        "figure is unknown.",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_prescribed_torch_headroom_bytes",
        "gauge",
        "The bytes vLLM 0.34 should keep free beside its extensible KV cache: what it keeps "
        "(modelkv_engine_torch_headroom_bytes) plus what the cache must give up for the prescription; absent for "
        "other engines.",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_sleep_level",
        "gauge",
        "vLLM's sleep level: 0 awake, 1 asleep with its weights offloaded to host memory, 2 asleep with its weights "
        "discarded (absent when the engine does not report it).",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_paged_kv_bytes",
        "gauge",
        "Bytes of the engine's paged KV cache (absent until known).",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_paged_kv_blocks",
        "gauge",
        "Blocks of the engine's paged KV cache (absent until known).",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_paged_kv_reserved_bytes",
        "gauge",
        "Bytes of address space an extensible KV cache (vLLM 0.34) reserved for its capacity, committed or not "
        "(absent for a KV cache allocated whole).",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_paged_kv_reserved_blocks",
        "gauge",
        "Blocks an extensible KV cache (vLLM 0.34) holds once fully committed (absent for a KV cache allocated whole).",
        ENGINE,
        _E,
    ),
    Metric(
        "modelkv_engine_up",
        "gauge",
        "1 when the engine's snapshot is fresh, 0 when its heartbeat is stale.",
        ENGINE,
        _E,
    ),
    Metric("modelkv_engine_snapshot_age_seconds", "gauge", "Seconds since the engine's last heartbeat.", ENGINE, _E),
    Metric(
        "modelkv_engine_start_time_seconds", "gauge", "Unix time the engine process started publishing.", ENGINE, _E
    ),
    Metric(
        "modelkv_engine_declarations_dropped",
        "gauge",
        "Declarations the engine could not publish (a declarer that raised counts once); absent when its hook "
        "does not report them.",
        ENGINE,
        _E,
    ),
    *[Metric(f"modelkv_memory_{m.source}_bytes", "gauge", f"Measured: {m.meaning}.", ENGINE, _M) for m in MEASUREMENTS],
    *[
        Metric(
            f"modelkv_memory_{m.source}_baseline_bytes",
            "gauge",
            f"Post-initialisation baseline of modelkv_memory_{m.source}_bytes.",
            ENGINE,
            _M,
        )
        for m in MEASUREMENTS
        if m.baseline
    ],
    Metric(
        "modelkv_memory_measurement_available",
        "gauge",
        "1 when the engine reports this measured-memory source, 0 when it cannot be measured.",
        (*ENGINE, "source"),
        _M,
    ),
    Metric(
        "modelkv_memory_breakdown_bytes",
        "gauge",
        "The engine's process memory by part (component: "
        + ", ".join(COMPONENT_NAMES)
        + "): the device bytes NVML gives the process on a device engine, resident memory on a host engine; a part "
        "that cannot be known is absent, and unexplained only present when the parts add up to the process figure.",
        (*ENGINE, "component"),
        _M,
    ),
    Metric(
        "modelkv_engine_ended_timestamp_seconds",
        "gauge",
        "Unix time an engine died, with why (reason: out_of_memory, error, or vanished: stale and its process gone "
        "without ending its snapshot, at its last heartbeat); absent for a clean shutdown and once the exporter "
        "forgets the engine (--forget-after).",
        (*ENGINE, "reason"),
        _N,
    ),
    Metric(
        "modelkv_engine_end_growth_bytes",
        "gauge",
        "What grew since the baseline in an engine that died, by part that does not overlap another (part: "
        + ", ".join(GROWN_PARTS)
        + "; they add up to its unplanned growth): its last sample, taken as it died; absent where not measured.",
        (*ENGINE, "part"),
        _N,
    ),
    Metric(
        "modelkv_engine_end_torch_reserved_free_bytes",
        "gauge",
        "Bytes torch's caching allocator held reserved but in no live tensor when the engine died (fragmentation "
        "where it is large beside the allocation that failed); absent where torch could not say.",
        ENGINE,
        _N,
    ),
    Metric(
        "modelkv_exporter_build_info",
        "info",
        "Version of the exporter and the newest snapshot schema it reads.",
        ("version", "schema_version"),
        _X,
    ),
    Metric(
        "modelkv_exporter_spool_scan_success",
        "gauge",
        "1 when the spool directory could be listed on this scrape, else 0.",
        (),
        _X,
    ),
    Metric(
        "modelkv_exporter_spool_files",
        "gauge",
        f"Snapshot files in the spool by state ({', '.join(state.value for state in EngineState)}); "
        "every state 0 while no engine publishes into the spool.",
        ("state",),
        _X,
    ),
    Metric(
        "modelkv_exporter_snapshot_rejections_total",
        "counter",
        "Snapshot file versions rejected since the exporter started, by reason.",
        ("reason",),
        _X,
    ),
    Metric(
        "modelkv_exporter_collect_duration_seconds",
        "gauge",
        "Seconds this scrape spent reading the spool and building metrics.",
        (),
        _X,
    ),
    Metric(
        "modelkv_exporter_http_refusals_total",
        "counter",
        "HTTP requests refused and connections cut short since the exporter started, by reason "
        "(limits on heads, bodies, connections and time).",
        ("reason",),
        _X,
    ),
    Metric(
        "modelkv_observed_peak_bytes",
        "gauge",
        "Most bytes the transformers caches of one declaring owner held at once since the engine started "
        "(absent when they cannot be observed).",
        OWNER,
        _O,
    ),
    Metric(
        "modelkv_observed_recent_peak_bytes",
        "gauge",
        "Most bytes the owner's caches held at once within the engine's last sample interval, caches freed "
        "before the sample included (absent when they cannot be observed).",
        OWNER,
        _O,
    ),
    Metric(
        "modelkv_observed_calls_total",
        "counter",
        "Calls into the owner in which it created, initialised or updated a transformers cache "
        "(absent when its caches cannot be observed).",
        OWNER,
        _O,
    ),
    Metric(
        "modelkv_observed_owner_calls_total",
        "counter",
        "Outermost calls into the owner's methods since the engine started observing, with or without a cache.",
        OWNER,
        _O,
    ),
    Metric(
        "modelkv_observation_available",
        "gauge",
        "1 when the engine observes what the owner's caches hold, 0 when it cannot (its observed figures are absent).",
        OWNER,
        _O,
    ),
    Metric(
        "modelkv_discovered_peak_bytes",
        "gauge",
        "Most bytes a module that the engine found holding cache memory held at once since the engine started "
        "(found_by: cache_layer or census).",
        DISCOVERED,
        _U,
    ),
    Metric(
        "modelkv_discovered_recent_peak_bytes",
        "gauge",
        "Most bytes the discovered owner held at once within the engine's last sample interval.",
        DISCOVERED,
        _U,
    ),
    Metric(
        "modelkv_discovered_owner_info",
        "info",
        "Class of one discovered owner, whether it also declares caches (declares: true or false), and the "
        "key/value layout seen (layout: layers=, kv_heads=, head_dim=, dtype=, positions=, rows=; empty when none).",
        ("engine", "owner", "owner_class", "found_by", "declares", "layout", "model", "stage"),
        _U,
    ),
    Metric(
        "modelkv_engine_discovered_owners",
        "gauge",
        "Discovered owners exported for the engine (absent when its writer does not report discovery or it is off).",
        ENGINE,
        _U,
    ),
    Metric(
        "modelkv_discovery_available",
        "gauge",
        "1 when the engine runs discovery, 0 when it is off or failed; absent when its writer does not report "
        "discovery.",
        ENGINE,
        _U,
    ),
    Metric(
        "modelkv_discovery_census_duration_seconds",
        "gauge",
        "Wall time of the engine's last census of the tensors its modules hold (absent before the first).",
        ENGINE,
        _U,
    ),
    Metric(
        "modelkv_discovery_census_exhausted",
        "gauge",
        "1 for the budget (modules, objects, depth) the last census ran out of: memory beyond it was not looked "
        "at (absent when none).",
        (*ENGINE, "budget"),
        _U,
    ),
    Metric(
        "modelkv_discovery_owners_omitted",
        "gauge",
        "Discovered owners not exported, by reason: below_floor (smaller than the engine's size floor), "
        "over_budget (past the engine's MODELKV_ENGINE_MAX_DISCOVERED_OWNERS), exporter_budget (past the exporter's "
        "--sidecar-max-discovered-owners).",
        (*ENGINE, "reason"),
        _U,
    ),
]

CATALOGUE: dict[str, Metric] = {metric.name: metric for metric in _METRICS}
MAX_LABELS = 8
"""Labels of a value series (gauge, counter): few, so aggregations stay cheap."""
MAX_INFO_LABELS = 10
"""Labels of an info series: one per declaration or engine, joined on and never aggregated, so it may carry more."""
