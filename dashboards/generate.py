"""Generate the Grafana dashboards in this folder with Grafana's Python SDK (grafana-foundation-sdk).

Run ``python dashboards/generate.py`` after changing a panel; the JSON files are committed,
and a test fails when they differ from a fresh generation. Every expression uses the
metrics of ``docs/metrics.md`` or the recording rules of ``deploy/prometheus/modelkv-rules.yaml``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

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

HERE = Path(__file__).resolve().parent
SCHEMA_VERSION = 39
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
ENGINE_SELECTOR = 'job=~"$job", model=~"$model", stage=~"$stage", engine=~"$engine"'
UNDECLARED_ALERT_BYTES = 256 * 1024 * 1024


def query(expr: str, legend: str = "", ref_id: str = "A", *, table_format: bool = False) -> prometheus.Dataquery:
    """A Prometheus target; ``table_format`` makes it an instant query shaped as a table."""
    target = prometheus.Dataquery().expr(expr).ref_id(ref_id).datasource(DATASOURCE)
    if table_format:
        return target.instant().format(PromQueryFormat.TABLE)
    return target.range().legend_format(legend or "__auto")


def per_engine(metric: str, legend: str, ref_id: str = "A") -> prometheus.Dataquery:
    """A range query of ``metric`` filtered by the job, model, stage and engine variables."""
    return query(f"{metric}{{{ENGINE_SELECTOR}}}", legend, ref_id)


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
            f"sum by (engine, owner, cache) (modelkv_declared_peak_bytes{{{ENGINE_SELECTOR}}})",
            "{{engine}} {{owner}}/{{cache}}",
        ),
    ).stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL).group("declared"))


def declared_against_measured() -> timeseries.Panel:
    dashed = [DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})]
    return graph(
        "Declared peak against measured growth",
        "Dashed: the engine's declared peak (all its model-local caches at max_num_seqs). "
        "Solid: its measured memory minus the post-initialisation baseline. Solid above dashed is undeclared memory.",
        "bytes",
        per_engine("modelkv_engine:declared_peak_bytes:sum", "declared {{engine}}", "A"),
        per_engine("modelkv_engine:memory_growth_bytes", "measured {{engine}} ({{source}})", "B"),
    ).override_by_query("A", dashed)


def declared_against_observed() -> timeseries.Panel:
    dashed = [DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})]
    return (
        graph(
            "Declared against observed, per owner",
            "Dashed: what each owner declares at its engine's max_num_seqs. Solid: the most its transformers caches "
            "were observed to hold at once, since the engine started; dotted: within the last sample interval. "
            "Solid above dashed is a declaration that under-reports. An owner whose caches cannot be observed has "
            "no solid line (see modelkv_observation_available).",
            "bytes",
            query(
                f"sum without (cache, scope, rows) (modelkv_declared_peak_bytes{{{ENGINE_SELECTOR}}})",
                "declared {{engine}} {{owner}}",
                "A",
            ),
            per_engine("modelkv_observed_peak_bytes", "observed {{engine}} {{owner}}", "B"),
            per_engine("modelkv_observed_recent_peak_bytes", "recent {{engine}} {{owner}}", "C"),
        )
        .override_by_query("A", dashed)
        .override_by_query("C", [DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dot", "dash": [0, 10]})])
    )


def undeclared_growth() -> timeseries.Panel:
    return (
        graph(
            "Undeclared memory growth",
            "Measured growth beyond the declared peak (never negative). The line marks the alert threshold.",
            "bytes",
            per_engine("modelkv_engine:undeclared_memory_bytes", "{{engine}} ({{source}})"),
        )
        .thresholds(thresholds((None, "green"), (UNDECLARED_ALERT_BYTES, "red")))
        .thresholds_style(common_builders.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.LINE))
    )


def device_headroom() -> timeseries.Panel:
    return graph(
        "Device headroom",
        "Free device memory, and the declared peak the engine's caches have not allocated yet. "
        "Pending above free will not fit at max_num_seqs.",
        "bytes",
        per_engine("modelkv_engine:device_free_bytes", "free {{engine}}", "A"),
        per_engine("modelkv_engine:declared_peak_pending_bytes", "pending {{engine}}", "B"),
    )


def safe_max_num_seqs() -> timeseries.Panel:
    return graph(
        "Safe max_num_seqs",
        "The largest max_num_seqs whose declared peak fits the device's free memory, against the configured one.",
        "none",
        per_engine("modelkv_engine:max_num_seqs_fitting_device", "fits {{engine}}", "A"),
        per_engine("modelkv_engine_max_num_seqs", "configured {{engine}}", "B"),
    ).decimals(0)


def measured_memory() -> timeseries.Panel:
    sources = ("process_gpu", "torch_reserved", "torch_allocated", "device_used", "process_resident")
    return graph(
        "Measured memory",
        "What each engine measures about its memory; a source it cannot measure is absent.",
        "bytes",
        *[
            per_engine(f"modelkv_memory_{source}_bytes", f"{source} {{{{engine}}}}", chr(65 + i))
            for i, source in enumerate(sources)
        ],
    )


def paged_kv() -> timeseries.Panel:
    return graph(
        "Paged KV cache",
        "Bytes of vLLM's own paged KV cache per engine, for scale against the model-local caches.",
        "bytes",
        per_engine("modelkv_engine_paged_kv_bytes", "{{engine}}"),
    )


def declarations_table() -> table.Panel:
    info_labels = "dtype, geometry, capacity_source, rows_reason, allocation_note"
    expr = (
        f"modelkv_declared_peak_bytes{{{ENGINE_SELECTOR}}}\n"
        f"* on (job, instance, engine, owner, cache) group_left ({info_labels})\n"
        'modelkv_declaration_info{job=~"$job", engine=~"$engine"}'
    )
    organize = DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {"Time": True, "__name__": True, "job": True},
            "indexByName": {
                "engine": 0,
                "owner": 1,
                "cache": 2,
                "scope": 3,
                "rows": 4,
                "Value": 5,
                "dtype": 6,
                "geometry": 7,
                "capacity_source": 8,
                "rows_reason": 9,
                "allocation_note": 10,
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


def up() -> timeseries.Panel:
    return graph(
        "Exporter and engines up",
        "1 = up. Exporter: Prometheus scrapes it. Spool: it can list the spool. Engine: its snapshot is fresh.",
        "none",
        query('up{job=~"$job"}', "exporter {{instance}}", "A"),
        query('modelkv_exporter_spool_scan_success{job=~"$job"}', "spool {{instance}}", "B"),
        per_engine("modelkv_engine_up", "engine {{engine}}", "C"),
    ).max(1)


def snapshot_age() -> timeseries.Panel:
    return graph(
        "Snapshot age",
        "Seconds since each engine's last heartbeat.",
        "s",
        per_engine("modelkv_engine_snapshot_age_seconds", "{{engine}}"),
    )


def spool_files() -> timeseries.Panel:
    return graph(
        "Spool files by state",
        "Snapshot files in each exporter's spool: exported, stale, ended or rejected.",
        "none",
        query('sum by (state) (modelkv_exporter_spool_files{job=~"$job"})', "{{state}}"),
    )


def rejections() -> timeseries.Panel:
    return graph(
        "Rejected snapshot files",
        "Snapshot file versions rejected per reason, in each interval.",
        "none",
        query(
            'sum by (reason) (increase(modelkv_exporter_snapshot_rejections_total{job=~"$job"}[$__rate_interval]))',
            "{{reason}}",
        ),
    )


def collect_duration() -> timeseries.Panel:
    return graph(
        "Collect duration",
        "Seconds each scrape spent reading the spool and building metrics, and the whole scrape as Prometheus saw it.",
        "s",
        query('modelkv_exporter_collect_duration_seconds{job=~"$job"}', "collect {{instance}}", "A"),
        query('scrape_duration_seconds{job=~"$job"}', "scrape {{instance}}", "B"),
    )


def label_variable(name: str, label: str, selector: str) -> dash.QueryVariable:
    """A multi-value variable of ``label``'s values, with All matching everything."""
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({selector}, {name})")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


PanelBuilder = timeseries.Panel | table.Panel
LAYOUT: list[tuple[str, list[tuple[Callable[[], PanelBuilder], int, int]]]] = [
    (
        "Declared against measured",
        [
            (declared_against_measured, 12, 9),
            (declared_by_owner, 12, 9),
            (declared_against_observed, 24, 9),
            (undeclared_growth, 8, 8),
            (device_headroom, 8, 8),
            (safe_max_num_seqs, 8, 8),
            (measured_memory, 12, 8),
            (paged_kv, 12, 8),
        ],
    ),
    ("Declarations", [(declarations_table, 24, 10)]),
    (
        "Exporter health",
        [(up, 8, 7), (snapshot_age, 8, 7), (collect_duration, 8, 7), (spool_files, 12, 7), (rejections, 12, 7)],
    ),
]


def overview() -> dict[str, object]:
    """The overview dashboard as a JSON-ready dict."""
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
        .with_variable(label_variable("model", "Model", 'modelkv_engine_info{job=~"$job"}'))
        .with_variable(label_variable("stage", "Stage", 'modelkv_engine_info{job=~"$job", model=~"$model"}'))
        .with_variable(
            label_variable("engine", "Engine", 'modelkv_engine_info{job=~"$job", model=~"$model", stage=~"$stage"}')
        )
    )
    for row_title, panels in LAYOUT:
        builder = builder.with_row(dash.Row(row_title))
        for make, width, height in panels:
            builder = builder.with_panel(make().span(width).height(height))
    model = builder.build()
    model.schema_version = SCHEMA_VERSION
    document: dict[str, object] = json.loads(json.dumps(model, cls=JSONEncoder))
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
