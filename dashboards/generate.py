"""Generate the Grafana dashboards in this folder with Grafana's Python SDK (grafana-foundation-sdk).

Run ``python dashboards/generate.py`` after changing a panel; the JSON files are committed,
and a test fails when they differ from a fresh generation. Every expression reads what the exporter
exports (``modelkv_*``), Prometheus's ``up`` and ``scrape_duration_seconds`` of the exporter's job, or a
series the recording rules of ``deploy/prometheus/modelkv-rules.yaml`` compute (``modelkv_engine:*``),
never a recorded copy of a raw series: a Prometheus that federates ``{__name__=~"modelkv_.+"}`` and the
job's ``up`` and ``scrape_duration_seconds`` has all it needs. Engines are named by
namespace, pod and engine id: replica pods publish the same engine id. Every panel has a fixed
id (``LAYOUT``), so links to a panel survive new panels. The JSON matches the types of every
``@grafana/schema`` version that ``tests/k8s/package.json`` pins (docs/dashboards.md names them).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    ThresholdsMode,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.dashboard import Threshold as ThresholdStep
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from modelkv_exporter.contract.thresholds import UNDECLARED_GROWTH_BYTES as UNDECLARED_ALERT_BYTES

HERE = Path(__file__).resolve().parent
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
POD_SELECTOR = 'job=~"$job", namespace=~"$namespace", pod=~"$pod"'
ENGINE_SELECTOR = f'{POD_SELECTOR}, model=~"$model", stage=~"$stage", engine=~"$engine"'
DEVICE_SELECTOR = 'device_key=~"$device"'
ENGINE = "{{namespace}}/{{pod}} {{engine}}"
POD = "{{namespace}}/{{pod}}"
OWNER = "{{owner}}"
MEASURED_SOURCES = (
    "torch_allocated",
    "torch_allocated_high_water",
    "torch_reserved",
    "process_gpu",
    "device_used",
    "process_resident",
)
"""The sources of the measured-memory panel, one series each (``modelkv_memory_<source>_bytes``)."""
COUNT_MIN_INTERVAL = "2m"
"""increase() per displayed interval needs windows that tile the time range ($__interval), each holding
several scrapes: at least 4 x the PodMonitor's 30 s interval."""
LEGACY_VARIABLE_KEYS = ("auto", "auto_count", "auto_min")
"""Interval-variable settings the SDK writes, at their defaults, on every variable: no @grafana/schema we
check (11.6 included) defines them on a variable, and a query or data source variable ignores them."""
LEGACY_TABLE_OPTION_KEYS = ("footer",)
"""The SDK writes a hidden footer into every table's options; Grafana 12.2 moved the footer into the
field config, and @grafana/schema 12.4 and 13 reject options.footer (11.6 accepts it; a hidden footer is
Grafana's default, so 11.6 draws the same table without it)."""


def query(expr: str, legend: str = "", ref_id: str = "A", *, table_format: bool = False) -> prometheus.Dataquery:
    """A Prometheus target; ``table_format`` makes it an instant query shaped as a table."""
    target = prometheus.Dataquery().expr(expr).ref_id(ref_id).datasource(DATASOURCE)
    if table_format:
        return target.instant().format(PromQueryFormat.TABLE)
    return target.range().legend_format(legend or "__auto")


def per_engine(metric: str, legend: str, ref_id: str = "A") -> prometheus.Dataquery:
    """A range query of ``metric`` filtered by the job, namespace, pod, model, stage and engine variables."""
    return query(f"{metric}{{{ENGINE_SELECTOR}}}", legend, ref_id)


def per_pod(metric: str, legend: str, ref_id: str = "A") -> prometheus.Dataquery:
    """A range query of an exporter's ``metric`` filtered by the job, namespace and pod variables."""
    return query(f"{metric}{{{POD_SELECTOR}}}", legend, ref_id)


def per_device(expr: str, legend: str, ref_id: str = "A") -> prometheus.Dataquery:
    """A range query of per-device series (``{selector}`` marks where the device filter goes)."""
    return query(expr.replace("{selector}", f"{{{DEVICE_SELECTOR}}}"), legend, ref_id)


def graph(title: str, description: str, unit: str, *targets: prometheus.Dataquery) -> timeseries.Panel:
    """A time series panel with a table legend and a shared tooltip."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .line_width(2)
        .fill_opacity(0)
        .legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
    )
    for target in targets:
        panel = panel.with_target(target)
    return panel


def thresholds(*steps: tuple[float | None, str]) -> dash.ThresholdsConfig:
    """Absolute thresholds from (value, colour) pairs; the first value is None (the base)."""
    return (
        dash.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([ThresholdStep(value=value, color=color) for value, color in steps])
    )


def declared_by_owner() -> timeseries.Panel:
    return graph(
        "Declared peak by owner",
        "Declared peak bytes of every model-local KV cache at its engine's max_num_seqs, stacked per engine.",
        "bytes",
        query(
            f"sum by (namespace, pod, engine, owner, cache) (modelkv_engine:declared_peak_bytes{{{ENGINE_SELECTOR}}})",
            f"{ENGINE} {{{{owner}}}}/{{{{cache}}}}",
        ),
    ).stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL).group("declared"))


DASHED = [DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})]
"""Line style of a declared figure drawn against a measured one."""
DOTTED = [DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dot", "dash": [0, 10]})]
"""Line style of a secondary figure (what caches explain, a recent peak)."""


def declared_against_measured() -> timeseries.Panel:
    return (
        graph(
            "Declared peak against measured growth",
            "Dashed: the engine's declared peak (all its model-local caches at max_num_seqs). Dotted: what its "
            "caches explain (the bytes they were seen to hold, where observed, else the declared peak). Solid: "
            "its growth since initialisation that its memory profile does not explain (live tensors beyond the "
            "activation peak vLLM planned for, plus memory outside torch). Solid above dotted is undeclared memory.",
            "bytes",
            per_engine("modelkv_engine:declared_peak_bytes:sum", f"declared {ENGINE}", "A"),
            per_engine("modelkv_engine:unplanned_growth_bytes", f"measured {ENGINE}", "B"),
            per_engine("modelkv_engine:cache_explained_bytes", f"explained {ENGINE}", "C"),
        )
        .override_by_query("A", DASHED)
        .override_by_query("C", DOTTED)
    )


def declared_against_observed() -> timeseries.Panel:
    return (
        graph(
            "Declared against observed, per owner",
            "Dashed: what each owner declares at its engine's max_num_seqs. Solid: the most its transformers caches "
            "were observed to hold at once, since the engine started; dotted: within the last sample interval. "
            "Solid above dashed is a declaration that under-reports. An owner whose caches cannot be observed has "
            "no solid line (see modelkv_observation_available).",
            "bytes",
            query(
                f"sum by (namespace, pod, engine, owner) (modelkv_engine:declared_peak_bytes{{{ENGINE_SELECTOR}}})",
                f"declared {ENGINE} {OWNER}",
                "A",
            ),
            per_engine("modelkv_observed_peak_bytes", f"observed {ENGINE} {OWNER}", "B"),
            per_engine("modelkv_observed_recent_peak_bytes", f"recent {ENGINE} {OWNER}", "C"),
        )
        .override_by_query("A", DASHED)
        .override_by_query("C", DOTTED)
    )


DISCOVERED = f"modelkv_engine:discovered_recent_peak_bytes{{{ENGINE_SELECTOR}}}"
"""Every discovered owner's recent peak, joined with its class, whether it declares, and its layout."""


def discovered_by_owner() -> timeseries.Panel:
    return graph(
        "Discovered caches by owner",
        "Modules the engine found holding cache memory, declared or not: the most each held at once within the "
        "engine's last sample interval. found_by cache_layer: a transformers cache built while no declaring owner "
        "ran; census: tensors the module holds that it did not hold after initialisation. An owner that declares "
        "nothing and holds much is a cache to declare (ModelKVUndeclaredCache).",
        "bytes",
        query(DISCOVERED, f"{ENGINE} {OWNER} ({{{{found_by}}}}, declares {{{{declares}}}})"),
    )


def undeclared_growth() -> timeseries.Panel:
    return (
        graph(
            "Undeclared memory growth",
            "Measured growth beyond what the engine's caches explain (never negative). The line marks the alert "
            "threshold; the alert fires after 15 minutes above it.",
            "bytes",
            per_engine("modelkv_engine:undeclared_memory_bytes", ENGINE),
        )
        .thresholds(thresholds((None, "green"), (UNDECLARED_ALERT_BYTES, "red")))
        .thresholds_style(common_builders.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE))
    )


def device_headroom() -> timeseries.Panel:
    return graph(
        "Device headroom",
        "Per device: its free memory, and the declared peak that the caches of all its engines have not "
        "allocated yet. Pending above free will not fit at max_num_seqs.",
        "bytes",
        per_device(
            "modelkv_engine:device_total_bytes:max{selector} - modelkv_engine:device_used_bytes:max{selector}",
            "free {{device}}",
            "A",
        ),
        per_device("modelkv_engine:device_declared_pending_bytes:sum{selector}", "pending {{device}}", "B"),
    )


def device_committed() -> timeseries.Panel:
    return graph(
        "Device memory at declared peak",
        "Per device: used memory plus every engine's pending declared cache, against the device's total. "
        "The exhaustion prediction extrapolates the first line over the last hour.",
        "bytes",
        per_device("modelkv_engine:device_committed_bytes:sum{selector}", "at declared peak {{device}}", "A"),
        per_device("modelkv_engine:device_total_bytes:max{selector}", "total {{device}}", "B"),
    )


def safe_max_num_seqs() -> timeseries.Panel:
    return graph(
        "Safe max_num_seqs",
        "The largest max_num_seqs whose declared peak fits the device's free memory, against the configured one.",
        "none",
        per_engine("modelkv_engine:max_num_seqs_fitting_device", f"fits {ENGINE}", "A"),
        per_engine("modelkv_engine_max_num_seqs", f"configured {ENGINE}", "B"),
    ).decimals(0)


def measured_memory() -> timeseries.Panel:
    return graph(
        "Measured memory",
        "What each engine measures about its memory, by source; a source it cannot measure is absent.",
        "bytes",
        *(
            per_engine(f"modelkv_memory_{source}_bytes", f"{source} {ENGINE}", chr(ord("A") + i))
            for i, source in enumerate(MEASURED_SOURCES)
        ),
    )


def growth_by_part() -> timeseries.Panel:
    return graph(
        "Growth by part",
        "The two parts of the measured growth: live tensors beyond the post-initialisation live tensors plus "
        "the profiled activation peak (negative while below it), and device memory outside torch's allocator.",
        "bytes",
        per_engine("modelkv_engine:live_tensor_growth_bytes", f"live tensors {ENGINE}", "A"),
        per_engine("modelkv_engine:non_torch_growth_bytes", f"outside torch {ENGINE}", "B"),
    )


def memory_by_part() -> timeseries.Panel:
    return (
        graph(
            "Memory by part",
            "Where each engine's memory goes, stacked: the runtime it held before its model (CUDA context, "
            "libraries), weights, paged KV cache, CUDA graph pools, the activation reserve, model-local caches, and "
            "the unexplained rest. Each part is measured on its own; the rest is the device bytes NVML gives the "
            "process (a CPU engine: its resident memory) less the parts, so a leak, memory made outside torch or a "
            "part's error shows there (below 0: a part counts more than the process holds). A part that cannot be "
            "known is absent, and so is the rest: the stack is then short of the whole. One panel per engine id "
            "(replicas of one id in several pods: pick a pod).",
            "bytes",
            query(
                f"sum by (namespace, pod, engine, component) (modelkv_memory_breakdown_bytes{{{ENGINE_SELECTOR}}})",
                f"{ENGINE} {{{{component}}}}",
            ),
        )
        .fill_opacity(60)
        .stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL).group("parts"))
        .repeat("engine")
        .repeat_direction("h")
        .max_per_row(2)
    )


def dropped_declarations() -> timeseries.Panel:
    return graph(
        "Dropped declarations",
        "Declarations each engine could not publish: declarers that raised, specs that could not be resolved. "
        "Absent for engines whose hook does not report them.",
        "none",
        per_engine("modelkv_engine_declarations_dropped", ENGINE),
    ).decimals(0)


def paged_kv() -> timeseries.Panel:
    return graph(
        "Paged KV cache",
        "Bytes of vLLM's own paged KV cache per engine, for scale against the model-local caches.",
        "bytes",
        per_engine("modelkv_engine_paged_kv_bytes", ENGINE),
    )


def declarations_table() -> table.Panel:
    expr = f"modelkv_engine:declared_peak_bytes{{{ENGINE_SELECTOR}}}"
    organize = DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {"Time": True, "__name__": True, "job": True, "instance": True},
            "indexByName": {
                "namespace": 0,
                "pod": 1,
                "engine": 2,
                "owner": 3,
                "cache": 4,
                "scope": 5,
                "rows": 6,
                "Value": 7,
                "dtype": 8,
                "geometry": 9,
                "capacity_source": 10,
                "rows_reason": 11,
                "allocation_note": 12,
            },
            "renameByName": {"Value": "declared peak"},
        },
    )
    return (
        table.Panel()
        .title("Declarations")
        .description("Every declared model-local KV cache, its peak at max_num_seqs, and its diagnostic strings.")
        .datasource(DATASOURCE)
        .unit("bytes")
        .with_target(query(expr, table_format=True))
        .with_transformation(organize)
        .sort_by([common_builders.TableSortByFieldState().display_name("declared peak").desc(True)])
    )


def discovered_table() -> table.Panel:
    organize = DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {"Time": True, "__name__": True, "job": True, "instance": True},
            "indexByName": {
                "namespace": 0,
                "pod": 1,
                "engine": 2,
                "owner": 3,
                "found_by": 4,
                "declares": 5,
                "Value": 6,
                "layout": 7,
                "owner_class": 8,
            },
            "renameByName": {"Value": "recent peak", "found_by": "found by", "layout": "layout seen"},
        },
    )
    return (
        table.Panel()
        .title("Discovered owners")
        .description(
            "Every module the engine found holding cache memory: how it was found, whether it declares anything, "
            "the most it held within the last sample interval, and the key/value layout seen (layers, kv_heads, "
            "head_dim, dtype, positions a row, rows) where its tensors have one."
        )
        .datasource(DATASOURCE)
        .unit("bytes")
        .with_target(query(DISCOVERED, table_format=True))
        .with_transformation(organize)
        .sort_by([common_builders.TableSortByFieldState().display_name("recent peak").desc(True)])
    )


def up() -> timeseries.Panel:
    return graph(
        "Exporter and engines up",
        "1 = up. Exporter: Prometheus scrapes it. Spool: it can list the spool. Engine: its snapshot is fresh.",
        "none",
        per_pod("up", f"exporter {POD}", "A"),
        per_pod("modelkv_exporter_spool_scan_success", f"spool {POD}", "B"),
        per_engine("modelkv_engine_up", f"engine {ENGINE}", "C"),
    ).max(1)


def snapshot_age() -> timeseries.Panel:
    return graph(
        "Snapshot age",
        "Seconds since each engine's last heartbeat.",
        "s",
        per_engine("modelkv_engine_snapshot_age_seconds", ENGINE),
    )


def spool_files() -> timeseries.Panel:
    return graph(
        "Spool files by state",
        "Snapshot files in each exporter's spool: exported, stale, ended, rejected or forgotten.",
        "none",
        query(f"sum by (state) (modelkv_exporter_spool_files{{{POD_SELECTOR}}})", "{{state}}"),
    )


def rejections() -> timeseries.Panel:
    return graph(
        "Rejected snapshot files",
        "Snapshot file versions rejected per reason, in each interval of the graph (2 minutes or more).",
        "none",
        query(
            f"sum by (reason) (increase(modelkv_exporter_snapshot_rejections_total{{{POD_SELECTOR}}}[$__interval]))",
            "{{reason}}",
        ),
    ).interval(COUNT_MIN_INTERVAL)


def collect_duration() -> timeseries.Panel:
    return graph(
        "Collect duration",
        "Seconds each scrape spent reading the spool and building metrics, and the whole scrape as Prometheus saw it.",
        "s",
        per_pod("modelkv_exporter_collect_duration_seconds", f"collect {POD}", "A"),
        per_pod("scrape_duration_seconds", f"scrape {POD}", "B"),
    )


def label_variable(name: str, label: str, selector: str, label_name: str = "") -> dash.QueryVariable:
    """A multi-value variable of the values of label ``label_name`` (default: ``name``), with All matching everything."""
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({selector}, {label_name or name})")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


PanelBuilder = timeseries.Panel | table.Panel
Row = tuple[int, str, list[tuple[int, Callable[[], PanelBuilder], int, int]]]
LAYOUT: list[Row] = [
    (
        1,
        "Declared against measured",
        [
            (2, declared_against_measured, 12, 9),
            (3, declared_by_owner, 12, 9),
            (20, declared_against_observed, 24, 9),
            (21, discovered_by_owner, 24, 9),
            (4, undeclared_growth, 8, 8),
            (5, device_headroom, 8, 8),
            (6, safe_max_num_seqs, 8, 8),
            (17, growth_by_part, 8, 8),
            (19, device_committed, 8, 8),
            (18, dropped_declarations, 8, 8),
            (7, measured_memory, 12, 8),
            (8, paged_kv, 12, 8),
            (23, memory_by_part, 24, 9),
        ],
    ),
    (9, "Declarations", [(10, declarations_table, 24, 10), (22, discovered_table, 24, 8)]),
    (
        11,
        "Exporter health",
        [
            (12, up, 8, 7),
            (13, snapshot_age, 8, 7),
            (14, collect_duration, 8, 7),
            (15, spool_files, 12, 7),
            (16, rejections, 12, 7),
        ],
    ),
]
"""Rows and their panels in order: (id, builder, width, height). An id is never reused or renumbered."""


def engine_ends_annotation() -> dash.AnnotationQuery:
    """A mark on every time panel where an engine died, from ``modelkv_engine_ended_timestamp_seconds`` (reason:
    out_of_memory, error, vanished), at the time it died (the series' value), for the engines the variables
    select."""
    return (
        dash.AnnotationQuery()
        .name("Engine ends")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("red")
        .expr(f"modelkv_engine_ended_timestamp_seconds{{{ENGINE_SELECTOR}}}")
    )


ENGINE_ENDS_OPTIONS = {
    "useValueForTime": True,
    "titleFormat": "{{engine}} ended: {{reason}}",
    "textFormat": "{{namespace}}/{{pod}}, model {{model}}, stage {{stage}}",
    "tagKeys": "reason",
}
"""The Prometheus data source's annotation options, which the SDK has no builder for: the mark at the series' value
(the time the engine died, not at every sample of the hour it is exported), titled with the engine and why. The
query goes in ``target`` (with its refId and a 1-minute interval), where Grafana's Prometheus data source keeps it."""


def overview_from_sdk() -> dict[str, Any]:
    """The overview dashboard as the SDK writes it, before ``without_legacy_fields``."""
    builder = (
        dash.Dashboard("modelkv: declared and measured GPU memory")
        .uid("modelkv-overview")
        .description("Model-local KV caches that models declare, against the memory their engines measure.")
        .tags(["modelkv", "vllm", "gpu-memory"])
        .time("now-6h", "now")
        .refresh("30s")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .readonly()
        .with_variable(dash.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(label_variable("job", "Job", "modelkv_exporter_build_info"))
        .with_variable(label_variable("namespace", "Namespace", 'modelkv_engine_info{job=~"$job"}'))
        .with_variable(label_variable("pod", "Pod", 'modelkv_engine_info{job=~"$job", namespace=~"$namespace"}'))
        .with_variable(label_variable("model", "Model", f"modelkv_engine_info{{{POD_SELECTOR}}}"))
        .with_variable(label_variable("stage", "Stage", f'modelkv_engine_info{{{POD_SELECTOR}, model=~"$model"}}'))
        .with_variable(
            label_variable(
                "engine", "Engine", f'modelkv_engine_info{{{POD_SELECTOR}, model=~"$model", stage=~"$stage"}}'
            )
        )
        .with_variable(
            label_variable("device", "Device", f"modelkv_engine:device:info{{{ENGINE_SELECTOR}}}", "device_key")
        )
    )
    builder = builder.annotation(engine_ends_annotation())
    for row_id, row_title, panels in LAYOUT:
        builder = builder.with_row(dash.Row(row_title).id(row_id))
        for panel_id, make, width, height in panels:
            builder = builder.with_panel(make().id(panel_id).span(width).height(height))
    document: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    for annotation in document["annotations"]["list"]:
        annotation["target"] = {"expr": annotation.pop("expr"), "refId": "Anno", "interval": "1m"}
        annotation.update(ENGINE_ENDS_OPTIONS)
    return document


def overview() -> dict[str, Any]:
    """The overview dashboard as a JSON-ready dict."""
    return without_legacy_fields(overview_from_sdk())


def without_legacy_fields(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` without the fields the SDK writes that a Grafana version we support does not define.

    ``del``, not ``pop``: an SDK upgrade that stops writing one of them fails here, loudly; a test fails
    when every checked @grafana/schema accepts one of them (the patch is then no longer needed).
    """
    for variable in document["templating"]["list"]:
        for key in LEGACY_VARIABLE_KEYS:
            del variable[key]
    for panel in document["panels"]:
        if panel["type"] == "table":
            for key in LEGACY_TABLE_OPTION_KEYS:
                del panel["options"][key]
    return document


DASHBOARDS: dict[str, Callable[[], dict[str, object]]] = {"modelkv-overview.json": overview}


def render_all() -> dict[Path, str]:
    """Every dashboard file of this folder and its expected content."""
    return {HERE / name: json.dumps(make(), indent=2, sort_keys=True) + "\n" for name, make in DASHBOARDS.items()}


def main() -> int:
    """Write every dashboard; with ``--check``, fail when a committed file differs instead."""
    stale = []
    for path, content in render_all().items():
        if path.exists() and path.read_text() == content:
            continue
        if "--check" in sys.argv:
            stale.append(path.name)
        else:
            path.write_text(content)
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
