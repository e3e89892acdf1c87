"""The rules and dashboards against a real Prometheus scraping the real sidecar over the demo's engines.

Every expression the rule file and the dashboards contain is evaluated through
Prometheus's query API and must return data; the undeclared-growth path is
followed live, from a publisher's measured memory to the recording rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from modelkv_exporter.demo.engines import DEMO_ENGINES, UNDER_DECLARING, start_engines
from tests.support import observed_engine, polling
from tests.support.processes import free_port, start_sidecar, stop_process
from tests.support.prometheus import query, running_prometheus, scrape_config
from tests.support.promql import (
    RULES_FILE,
    alerts,
    dashboard_expressions,
    rule_expressions,
    substitute,
    variable_queries,
)
from tests.support.scenario import GIB, Scenario, declared_peak, start_scenario

JOB = "modelkv-exporter"
TIMEOUT = 120.0


@dataclass
class Live:
    """Prometheus scraping the scenario, and when it started."""

    prometheus: str
    started_at: float
    scenario: Scenario


def _relabelled(job: str, target: str) -> str:
    return (
        f"  - job_name: {job}\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
        f"    relabel_configs: [{{target_label: job, replacement: {JOB}}}]\n"
    )


def eventually(check: Callable[[], object], what: str) -> object:
    """The tests' polling helper with this module's patience (Prometheus scrapes and evaluates every second)."""
    return polling.eventually(check, what, timeout=TIMEOUT, interval=0.5)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("live")
    spool, gone = tmp / "spool", tmp / "gone"
    spool.mkdir()
    gone.mkdir()
    processes, stop = start_engines(str(spool), 1.0)
    unused, unused_stop = observed_engine.start(str(spool))
    scenario = start_scenario(spool)
    sidecar = start_sidecar(spool)
    broken = start_sidecar(gone)
    gone.rmdir()
    extra = _relabelled("modelkv-broken-spool", broken.url.removeprefix("http://")) + _relabelled(
        "modelkv-unreachable", f"127.0.0.1:{free_port()}"
    )
    config = scrape_config({JOB: sidecar.url}, rule_files=(RULES_FILE,), extra=extra)
    started_at = time.time()
    try:
        with running_prometheus(tmp, config) as prometheus:
            engines = {e.engine_id for e in DEMO_ENGINES} | {"sim-gpu-leak", "sim-gpu-tight", observed_engine.ENGINE_ID}
            eventually(
                lambda: engines <= {r["metric"]["engine"] for r in query(prometheus, "modelkv_engine_up == 1")},
                "every demo and simulated engine to be scraped",
            )
            yield Live(prometheus, started_at, scenario)
    finally:
        scenario.stop()
        stop.set()
        unused_stop.set()
        for process in [*processes, unused]:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
        stop_process(sidecar.process)
        stop_process(broken.process)


def _value(live: Live, promql: str) -> float | None:
    result = query(live.prometheus, promql)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def test_growth_inside_the_declared_peak_is_zero_and_beyond_it_is_undeclared(live: Live) -> None:
    peak = declared_peak()
    leak = live.scenario.leak
    selector = '{engine="sim-gpu-leak"}'
    with leak.lock:
        leak.growth = peak // 2
    eventually(lambda: _value(live, f"modelkv_engine:memory_growth_bytes{selector}") == peak // 2, "growth of half")
    assert _value(live, f"modelkv_engine:undeclared_memory_bytes{selector}") == 0
    assert _value(live, f"modelkv_engine:declared_peak_pending_bytes{selector}") == peak - peak // 2

    with leak.lock:
        leak.growth = peak
    eventually(lambda: _value(live, f"modelkv_engine:memory_growth_bytes{selector}") == peak, "growth to the peak")
    assert _value(live, f"modelkv_engine:undeclared_memory_bytes{selector}") == 0, "filling the peak is declared"

    with leak.lock:
        leak.growth = peak + GIB
    eventually(lambda: _value(live, f"modelkv_engine:undeclared_memory_bytes{selector}") == GIB, "1 GiB undeclared")
    (series,) = query(live.prometheus, f"modelkv_engine:undeclared_memory_bytes{selector}")
    assert series["metric"]["source"] == "process_gpu" and series["metric"]["job"] == JOB
    assert _value(live, 'modelkv_engine:undeclared_memory_bytes{engine="sim-gpu-tight"}') == 0


def test_the_tight_device_fits_fewer_sequences(live: Live) -> None:
    # 1 GiB free, 4 GiB + 1 GiB declared of which 2 GiB allocated: 3 GiB pending, 512 MiB a sequence.
    selector = '{engine="sim-gpu-tight"}'
    assert _value(live, f"modelkv_engine:declared_peak_pending_bytes{selector}") == declared_peak() - 2 * GIB
    assert _value(live, f"modelkv_engine:device_free_bytes{selector}") == GIB
    assert _value(live, f"modelkv_engine:max_num_seqs_fitting_device{selector}") == 8 + (GIB - 3 * GIB) // (GIB // 2)


def test_every_rule_and_dashboard_expression_returns_data(live: Live) -> None:
    with live.scenario.leak.lock:
        live.scenario.leak.growth = declared_peak() + GIB
    absent = [e for e in rule_expressions() if e.expr.startswith("absent(")]
    present = [e for e in rule_expressions() + dashboard_expressions() if e not in absent]
    assert len(present) >= 30
    for expression in present:
        promql = substitute(expression.expr)
        assert "$" not in promql, expression.origin
        eventually(lambda promql=promql: query(live.prometheus, promql), f"data from {expression.origin}: {promql}")
    for expression in absent:
        assert query(live.prometheus, expression.expr) == [], "the exporter is present"
        assert query(live.prometheus, expression.expr, at=live.started_at - 60), "and was absent before"
    for variable in variable_queries():
        selector, label = substitute(variable.expr).removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
        values = {r["metric"].get(label) for r in query(live.prometheus, selector)}
        assert values - {None, ""}, f"{variable.origin} offers no values"


def test_every_alert_goes_pending_or_firing_in_prometheus(live: Live) -> None:
    with live.scenario.leak.lock:
        live.scenario.leak.growth = declared_peak() + GIB
    expected = {a["alert"] for a in alerts()} - {"ModelKVExporterAbsent"}

    def active() -> set[str]:
        return {r["metric"]["alertname"] for r in query(live.prometheus, "ALERTS")}

    eventually(lambda: expected <= active(), f"alerts {sorted(expected)} (active: {sorted(active())})")
    firing = {r["metric"]["alertname"] for r in query(live.prometheus, 'ALERTS{alertstate="firing"}')}
    assert "ModelKVSnapshotsRejected" in firing, "an alert without 'for' fires at once"
    stale = query(live.prometheus, 'ALERTS{alertname="ModelKVSnapshotStale"}')
    assert {r["metric"]["engine"] for r in stale} == {"sim-stale"}
    undeclared = query(live.prometheus, 'ALERTS{alertname="ModelKVUndeclaredMemoryGrowth"}')
    assert "sim-gpu-tight" not in {r["metric"]["engine"] for r in undeclared}, "growth within the peak never pages"


def test_declaration_under_reports_fires_for_the_deliberate_engine_and_no_other(live: Live) -> None:
    """The demo engine whose owner holds 1.5x its declaration pages; the demo owners that hold exactly theirs do not."""

    def firing() -> set[tuple[str, str]]:
        alerts = query(live.prometheus, 'ALERTS{alertname="ModelKVDeclarationUnderReports", alertstate="firing"}')
        return {(r["metric"]["engine"], r["metric"]["owner"]) for r in alerts}

    eventually(lambda: firing(), "ModelKVDeclarationUnderReports to fire")
    assert firing() == {(UNDER_DECLARING, "tokenizer.decoder")}
    any_state = query(live.prometheus, 'ALERTS{alertname="ModelKVDeclarationUnderReports"}')
    assert {r["metric"]["engine"] for r in any_state} == {UNDER_DECLARING}, "not even pending for another"
    observed = {
        r["metric"]["engine"]: float(r["value"][1])
        for r in query(live.prometheus, "modelkv_observed_peak_bytes")
        if r["metric"]["engine"] != observed_engine.ENGINE_ID
    }
    assert observed.keys() == {e.engine_id for e in DEMO_ENGINES if e.owners}, "every demo owner is observed"


def test_a_cache_that_stopped_working_goes_pending(live: Live) -> None:
    def unused() -> set[str]:
        alerts = query(live.prometheus, 'ALERTS{alertname="ModelKVDeclaredCacheUnused"}')
        return {r["metric"]["engine"] for r in alerts}

    eventually(lambda: unused(), "ModelKVDeclaredCacheUnused to go pending")
    assert unused() == {observed_engine.ENGINE_ID}
    available = query(live.prometheus, f'modelkv_observation_available{{engine="{observed_engine.ENGINE_ID}"}}')
    assert [float(r["value"][1]) for r in available] == [1.0], "its caches are observable: it is the cache that idles"
