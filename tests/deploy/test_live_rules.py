"""The rules and dashboards against a real Prometheus scraping the real sidecar over the demo's engines.

Every expression the rule file and the dashboards contain is evaluated through Prometheus's
query API and must return data; the growth signals are followed live, from a publisher's
measured memory to the recording rules and the alerts: a plateau does not page, a live-tensor
leak does, a dropped declaration does, a demo engine that dies of a real ``torch.OutOfMemoryError`` does. Two sidecars stand for two replica pods (their targets
carry the namespace and pod labels scrape discovery adds), and a second Prometheus federates
only what docs/deploy.md advises (the modelkv_* series and the job's up and scrape duration), on
which the dashboard must still work.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from modelkv_exporter.demo.engines import DEMO_ENGINES, DYING_ENGINE, UNDECLARED, UNDER_DECLARING, start_engines
from modelkv_testbed.polling import eventually
from modelkv_testbed.processes import free_port, start_sidecar, stop_process
from modelkv_testbed.prometheus import query, running_prometheus, scrape_config
from modelkv_testbed.promql import (
    FEDERATION_MATCH,
    RULES_FILE,
    alerts,
    dashboard_expressions,
    rule_expressions,
    substitute,
    variable_queries,
)
from modelkv_testbed.scenario import GIB, Scenario, declared_peak, start_replica, start_scenario
from tests.support import observed_engine

pytestmark = pytest.mark.slow

JOB = "modelkv-exporter"
TIMEOUT = 120.0
SIMULATED = {
    "sim-gpu-leak",
    "sim-gpu-plateau",
    "sim-gpu-tight",
    "sim-gpu-tight-peer",
    "sim-dropped",
    "sim-shrinking",
    "sim-replica",
}


@dataclass
class Live:
    """Prometheus scraping the scenario, the federating Prometheus, and when they started."""

    prometheus: str
    federated: str
    started_at: float
    scenario: Scenario


def _target(target: str, pod: str) -> str:
    return f"{{targets: ['{target.removeprefix('http://')}'], labels: {{namespace: llm, pod: {pod}}}}}"


def _jobs(sidecars: dict[str, str], broken: str, unreachable: str) -> str:
    """The exporter's job over two replica pods and a pod with no engine, and two broken targets relabelled into it (as a
    PodMonitor would)."""
    targets = ", ".join(_target(url, pod) for pod, url in sidecars.items())
    lines = [f"  - job_name: {JOB}\n    static_configs: [{targets}]\n"]
    for name, target, pod in (
        ("modelkv-broken-spool", broken, "broken-0"),
        ("modelkv-unreachable", unreachable, "gone-0"),
    ):
        lines.append(
            f"  - job_name: {name}\n"
            f"    static_configs: [{_target(target, pod)}]\n"
            f"    relabel_configs: [{{target_label: job, replacement: {JOB}}}]\n"
        )
    return "".join(lines)


def _federation(prometheus: str) -> str:
    return (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: federate\n"
        "    honor_labels: true\n"
        "    metrics_path: /federate\n"
        f"    params: {{'match[]': {json.dumps(list(FEDERATION_MATCH))}}}\n"
        f"    static_configs: [{{targets: ['{prometheus.removeprefix('http://')}']}}]\n"
    )


def wait(check: Callable[[], object], what: str) -> object:
    """Poll Prometheus (twice a second) until ``check`` returns something truthy."""
    return eventually(check, what, timeout=TIMEOUT, interval=0.5)


def _declared(prometheus: str, engine: str) -> float | None:
    result = query(prometheus, f'modelkv_engine_declarations{{engine="{engine}"}}')
    return float(result[0]["value"][1]) if result else None


NOT_IN_THE_LIVE_RUN = {
    "ModelKVDeviceMemoryExhaustionImminent": "a device filling steadily for 10 minutes, which the live run's few minutes "
    "of steps never do (story-i-small-slice-filling-fast has one)",
}
"""Alerts whose condition the live run cannot produce, and why."""

UNDECLARED_CACHE_FOR = "1m"
"""``ModelKVUndeclaredCache``'s ``for`` in the live run (15m in the rule file): an operator sets it so with the chart's
``undeclaredCache.forMinutes``; here it lets the run see the alert fire, not only go pending."""


def live_rules(text: str) -> str:
    """The rule file as the live run loads it: ``ModelKVUndeclaredCache`` waits ``UNDECLARED_CACHE_FOR``, the rest as is."""
    head, alert, tail = text.partition("- alert: ModelKVUndeclaredCache\n")
    body, found, rest = tail.partition("for: 15m")
    assert alert and found and "- alert:" not in body, "ModelKVUndeclaredCache's own for: 15m"
    return head + alert + body + f"for: {UNDECLARED_CACHE_FOR}" + rest


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("live")
    spool, replica, gone, empty = tmp / "spool", tmp / "replica", tmp / "gone", tmp / "empty"
    for directory in (spool, replica, gone, empty, tmp / "main", tmp / "federated"):
        directory.mkdir()
    processes, stop = start_engines(str(spool), 1.0, (*DEMO_ENGINES, DYING_ENGINE))
    unused, unused_stop = observed_engine.start(str(spool))
    scenario = start_scenario(spool)
    replicas = [start_replica(spool), start_replica(replica)]
    sidecar, other = start_sidecar(spool), start_sidecar(replica)
    broken = start_sidecar(gone)
    bare = start_sidecar(empty)  # a pod whose engine never loads the plugin: no snapshot ever reaches its spool
    gone.rmdir()
    sidecars = {"demo-0": sidecar.url, "demo-1": other.url, "bare-0": bare.url}
    extra = _jobs(sidecars, broken.url, f"127.0.0.1:{free_port()}")
    rules = tmp / "modelkv-rules.yaml"
    rules.write_text(live_rules(RULES_FILE.read_text()))
    config = scrape_config({}, rule_files=(rules,), extra=extra)
    started_at = time.time()
    try:
        with contextlib.ExitStack() as stack:
            prometheus = stack.enter_context(running_prometheus(tmp / "main", config))
            engines = {e.engine_id for e in DEMO_ENGINES} | SIMULATED | {observed_engine.ENGINE_ID}
            wait(
                lambda: engines <= {r["metric"]["engine"] for r in query(prometheus, "modelkv_engine_up == 1")},
                "every demo and simulated engine to be scraped",
            )
            wait(
                lambda: query(prometheus, 'modelkv_engine_ended_timestamp_seconds{reason="out_of_memory"}'),
                "the demo engine that dies of out-of-memory to be seen ended",
            )
            wait(lambda: _declared(prometheus, "sim-shrinking") == 2, "two declarations seen")
            scenario.shrink()
            wait(lambda: _declared(prometheus, "sim-shrinking") == 1, "one declaration seen")
            federated = stack.enter_context(running_prometheus(tmp / "federated", _federation(prometheus)))
            yield Live(prometheus, federated, started_at, scenario)
    finally:
        scenario.stop()
        for publisher in replicas:
            publisher.end()
        stop.set()
        unused_stop.set()
        for process in [*processes, unused]:
            process.join(timeout=15)
            if process.is_alive():
                process.kill()
        for process in (sidecar, other, broken, bare):
            stop_process(process.process)


def _value(live: Live, promql: str) -> float | None:
    result = query(live.prometheus, promql)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def _firing_or_pending(live: Live) -> list[dict[str, Any]]:
    response = httpx.get(live.prometheus + "/api/v1/alerts", timeout=10)
    assert response.status_code == 200
    alerts_now: list[dict[str, Any]] = response.json()["data"]["alerts"]
    return alerts_now


def test_a_live_tensor_leak_is_undeclared_once_it_exceeds_the_declared_peak(live: Live) -> None:
    peak = declared_peak()
    leak = live.scenario.leak
    selector = '{engine="sim-gpu-leak"}'
    with leak.lock:
        leak.live = peak // 2
    wait(lambda: _value(live, f"modelkv_engine:unplanned_growth_bytes{selector}") == peak // 2, "half")
    assert _value(live, f"modelkv_engine:undeclared_memory_bytes{selector}") == 0
    assert _value(live, f"modelkv_engine:declared_peak_pending_bytes{selector}") == peak - peak // 2

    with leak.lock:
        leak.live = peak
    wait(lambda: _value(live, f"modelkv_engine:unplanned_growth_bytes{selector}") == peak, "growth to the peak")
    assert _value(live, f"modelkv_engine:undeclared_memory_bytes{selector}") == 0, "filling the peak is declared"

    with leak.lock:
        leak.live = peak + GIB
    wait(lambda: _value(live, f"modelkv_engine:undeclared_memory_bytes{selector}") == GIB, "1 GiB undeclared")
    (series,) = query(live.prometheus, f"modelkv_engine:undeclared_memory_bytes{selector}")
    assert "source" not in series["metric"], "one series whichever source answered"
    assert {k: series["metric"][k] for k in ("job", "namespace", "pod")} == {
        "job": JOB,
        "namespace": "llm",
        "pod": "demo-0",
    }
    assert _value(live, 'modelkv_engine:undeclared_memory_bytes{engine="sim-gpu-tight"}') == 0


def test_an_allocator_plateau_is_measured_but_never_undeclared(live: Live) -> None:
    selector = '{engine="sim-gpu-plateau"}'
    wait(lambda: _value(live, f"modelkv_engine:memory_growth_bytes{selector}") == GIB, "the 1 GiB plateau")
    assert _value(live, f"modelkv_engine:unplanned_growth_bytes{selector}") == 0
    assert _value(live, f"modelkv_engine:live_tensor_growth_bytes{selector}") == -GIB // 4, (
        "below the profiled activation peak"
    )
    assert _value(live, f"max_over_time(modelkv_engine:undeclared_memory_bytes{selector}[1h])") == 0


def test_engines_sharing_a_device_are_added_up(live: Live) -> None:
    # Two engines on one device with 4 GiB free, each 5 GiB declared of which 2 GiB allocated: 6 GiB pending.
    device = '{device_key="GPU-51a1ea4e-0000-4000-8000-000000000003"}'
    assert _value(live, f"modelkv_engine:device_declared_pending_bytes:sum{device}") == 2 * (declared_peak() - 2 * GIB)
    free = f"modelkv_engine:device_total_bytes:max{device} - modelkv_engine:device_used_bytes:max{device}"
    assert _value(live, free) == 4 * GIB
    for engine in ("sim-gpu-tight", "sim-gpu-tight-peer"):
        fits = _value(live, f'modelkv_engine:max_num_seqs_fitting_device{{engine="{engine}"}}')
        assert fits == 8 + (4 * GIB - 6 * GIB) // (GIB // 2), engine


def test_replica_pods_of_one_engine_id_stay_apart(live: Live) -> None:
    declared = query(live.prometheus, 'modelkv_engine:declared_peak_bytes:sum{engine="sim-replica"}')
    assert sorted((r["metric"]["pod"], float(r["value"][1])) for r in declared) == [
        ("demo-0", declared_peak()),
        ("demo-1", declared_peak()),
    ]
    (by_owner,) = [e for e in dashboard_expressions() if "Declared peak by owner" in e.origin]
    shown = query(live.prometheus, substitute(by_owner.expr).replace('engine=~".*"', 'engine="sim-replica"'))
    assert {(r["metric"]["pod"], r["metric"]["cache"]) for r in shown} == {
        (pod, cache) for pod in ("demo-0", "demo-1") for cache in ("talker_kv", "graph_pool")
    }


def test_every_rule_and_dashboard_expression_returns_data(live: Live) -> None:
    with live.scenario.leak.lock:
        live.scenario.leak.live = declared_peak() + GIB
    absent = [e for e in rule_expressions() if e.expr.startswith("absent(")]
    present = [
        e
        for e in rule_expressions() + dashboard_expressions()
        if e not in absent and e.origin not in NOT_IN_THE_LIVE_RUN
    ]
    assert len(present) >= 60
    for expression in present:
        promql = substitute(expression.expr)
        assert not re.search(r"\$[a-z_]", promql), f"{expression.origin}: a variable left in {promql}"
        wait(
            lambda promql=promql: query(live.prometheus, promql),
            f"data from {expression.origin}: {promql}",
        )
    for expression in absent:
        assert query(live.prometheus, expression.expr) == [], "the exporter is present"
        assert query(live.prometheus, expression.expr, at=live.started_at - 60), "and was absent before"
    for variable in variable_queries():
        selector, label = substitute(variable.expr).removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
        values = {r["metric"].get(label) for r in query(live.prometheus, selector)}
        assert values - {None, ""}, f"{variable.origin} offers no values"


def test_the_dashboard_works_from_the_federated_series_alone(live: Live) -> None:
    """A Prometheus federating what docs/deploy.md advises (FEDERATION_MATCH) draws every panel and variable."""
    federated = '{__name__=~".+", job!="federate"}'
    wait(lambda: query(live.federated, federated), "federated series")
    names = {r["metric"]["__name__"] for r in query(live.federated, federated)}
    assert all(name.startswith("modelkv_") or name in ("up", "scrape_duration_seconds") for name in names), sorted(
        names
    )
    for expression in dashboard_expressions():
        promql = substitute(expression.expr)
        wait(
            lambda promql=promql: query(live.federated, promql),
            f"federated data for {expression.origin}: {promql}",
        )
    for variable in variable_queries():
        selector, label = substitute(variable.expr).removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
        values = {r["metric"].get(label) for r in query(live.federated, selector)}
        assert values - {None, ""}, f"{variable.origin} offers no federated values"


def test_every_alert_goes_pending_or_firing_and_a_plateau_never_does(live: Live) -> None:
    with live.scenario.leak.lock:
        live.scenario.leak.live = declared_peak() + GIB
    expected = {a["alert"] for a in alerts()} - {"ModelKVExporterAbsent"} - set(NOT_IN_THE_LIVE_RUN)

    def active() -> set[str]:
        return {r["metric"]["alertname"] for r in query(live.prometheus, "ALERTS")}

    wait(lambda: expected <= active(), f"alerts {sorted(expected)} (active: {sorted(active())})")

    def predicted_tiers() -> set[str]:
        alerts = query(live.prometheus, 'ALERTS{alertname="ModelKVDeviceMemoryExhaustionPredicted"}')
        return {r["metric"]["severity"] for r in alerts}

    wait(lambda: predicted_tiers() == {"critical", "warning"}, "both tiers of ModelKVDeviceMemoryExhaustionPredicted")
    by_name: dict[str, list[dict[str, Any]]] = {}
    for alert in _firing_or_pending(live):
        by_name.setdefault(alert["labels"]["alertname"], []).append(alert)

    undeclared = {a["labels"]["engine"] for a in by_name["ModelKVUndeclaredMemoryGrowth"]}
    assert "sim-gpu-leak" in undeclared, "a live-tensor leak pages"
    assert not undeclared & {"sim-gpu-plateau", "sim-gpu-tight", "sim-gpu-tight-peer"}, "a plateau never does"
    assert query(live.prometheus, 'ALERTS{engine="sim-gpu-plateau"}') == []

    dropped = {(a["labels"]["engine"], a["labels"]["cause"]) for a in by_name["ModelKVDeclarationsDropped"]}
    assert dropped == {("sim-dropped", "declaration_failed"), ("sim-shrinking", "fewer_than_before")}

    (will_not_fit,) = by_name["ModelKVDeclaredPeakWillNotFit"]
    assert will_not_fit["labels"]["device"] == "GPU-51a1ea4e-0000-4000-8000-000000000003"
    assert will_not_fit["annotations"]["description"].endswith(
        "Engines on the device: llm/demo-0/sim-gpu-tight, llm/demo-0/sim-gpu-tight-peer."
    )
    predicted = by_name["ModelKVDeviceMemoryExhaustionPredicted"]
    assert {a["labels"]["device"] for a in predicted} == {"GPU-51a1ea4e-0000-4000-8000-000000000001"}
    assert sorted(a["labels"]["severity"] for a in predicted) == ["critical", "warning"], "once per device and tier"

    stale = query(live.prometheus, 'ALERTS{alertname="ModelKVSnapshotStale"}')
    assert {r["metric"]["engine"] for r in stale} == {"sim-stale"}
    no_engine = query(live.prometheus, 'ALERTS{alertname="ModelKVNoEnginePublishing"}')
    assert {r["metric"]["pod"] for r in no_engine} == {"bare-0"}, "the pod with no engine, and no other"
    for alert in _firing_or_pending(live):
        assert alert["annotations"]["runbook_url"].startswith("https://"), alert["labels"]["alertname"]


def test_declaration_under_reports_fires_for_the_deliberate_engine_and_no_other(live: Live) -> None:
    """The demo engine whose owner holds 1.5x its declaration pages; the demo owners that hold exactly theirs do not."""

    def firing() -> set[tuple[str, str]]:
        alerts = query(live.prometheus, 'ALERTS{alertname="ModelKVDeclarationUnderReports", alertstate="firing"}')
        return {(r["metric"]["engine"], r["metric"]["owner"]) for r in alerts}

    wait(lambda: firing(), "ModelKVDeclarationUnderReports to fire")
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

    wait(lambda: unused(), "ModelKVDeclaredCacheUnused to go pending")
    assert unused() == {observed_engine.ENGINE_ID}
    available = query(live.prometheus, f'modelkv_observation_available{{engine="{observed_engine.ENGINE_ID}"}}')
    assert [float(r["value"][1]) for r in available] == [1.0], "its caches are observable: it is the cache that idles"


def test_an_undeclared_cache_fires_for_its_owner_alone_and_is_explained(live: Live) -> None:
    """The demo engine whose module keeps a cache it does not declare: ModelKVUndeclaredCache fires for that owner
    alone (never even pending for another engine), its bytes are counted as explained, and the engine gets no
    undeclared-growth alert."""

    def undeclared(state: str) -> set[tuple[str, str]]:
        """The alert's engines and owners in ``state``; the engine that died of its leak is left out: its leaking
        cache is undeclared too, and whether a census saw it in the seconds it lived is a race."""
        alerts = query(live.prometheus, f'ALERTS{{alertname="ModelKVUndeclaredCache"{state}}}')
        return {(r["metric"]["engine"], r["metric"]["owner"]) for r in alerts} - {
            (DYING_ENGINE.engine_id, owner) for owner, _ in DYING_ENGINE.undeclared
        }

    wait(lambda: undeclared(', alertstate="firing"'), "ModelKVUndeclaredCache to fire")
    assert undeclared(', alertstate="firing"') == {(UNDECLARED, "apm.streaming_kv")}
    assert undeclared("") == {(UNDECLARED, "apm.streaming_kv")}, "not even pending for another engine"
    selector = f'{{engine="{UNDECLARED}"}}'
    recent = _value(live, f"modelkv_engine:discovered_undeclared_recent_peak_bytes:max{selector}")
    assert recent is not None and recent > 64 * 1024 * 1024
    explained = _value(live, f"modelkv_engine:cache_explained_bytes{selector}")
    assert explained is not None and explained >= recent
    growth = query(live.prometheus, f'ALERTS{{alertname="ModelKVUndeclaredMemoryGrowth", engine="{UNDECLARED}"}}')
    assert growth == []
