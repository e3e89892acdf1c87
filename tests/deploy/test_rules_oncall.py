"""Issue 48's on-call rules, each mechanism broken on purpose: pods that are gone, a Prometheus that stored nothing,
the "still rising" test's minimum step, and a sidecar with no engine, as a real sidecar exports it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest
import yaml
from fastapi import FastAPI

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.contract.thresholds import NO_ENGINE_SECONDS
from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig
from modelkv_testbed import ROOT
from modelkv_testbed.processes import InThread, free_port, require_tool, serving_in_thread
from modelkv_testbed.promql import RULES_FILE
from modelkv_testbed.simulation.render import scraped_series, selector
from modelkv_testbed.simulation.story import Firing, Held, Quiet
from modelkv_testbed.snapshots import make_snapshot

TESTS = ROOT / "deploy" / "prometheus" / "tests"
GONE = """
          unless on (job, instance) (
            last_over_time(up{job="modelkv-exporter"}[10m]) unless up{job="modelkv-exporter"}
            and on () group(up{job="modelkv-exporter"})
          )"""
IN_AN_OUTAGE = '\n            and on () group(up{job="modelkv-exporter"})'
MIN_STEP = ">= 20 * 1024 * 1024"
TARGET = {"job": "modelkv-exporter", "namespace": "llm"}
NO_ENGINE = "ModelKVNoEnginePublishing"


def promtool(rules: str, tests: dict[str, str], directory: Path) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of ``tests`` (file name: text) against ``rules``, in ``directory``; what it says (its
    failures are on standard error) in ``stdout``."""
    (directory / "tests").mkdir(parents=True)
    (directory / "modelkv-rules.yaml").write_text(rules)
    for name, text in tests.items():
        (directory / "tests" / name).write_text(text)
    return subprocess.run(
        [require_tool("promtool"), "test", "rules", *tests],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=directory / "tests",
    )


def story_file(name: str) -> dict[str, str]:
    """A generated story's test file, by its name."""
    return {name: (TESTS / name).read_text()}


def test_a_deleted_pod_is_not_paged_as_stale_once_its_target_is_gone(tmp_path: Path) -> None:
    """Without the clause on targets that are gone, the drained pod's engine (stale for two scrapes before its pod
    went) pages for minutes after its pod is deleted."""
    rules = RULES_FILE.read_text()
    assert GONE in rules
    story = story_file("story-oncall-a-drained-pods-are-gone.test.yaml")
    assert promtool(rules, story, tmp_path / "kept").returncode == 0
    broken = promtool(rules.replace(GONE, ""), story, tmp_path / "broken")
    assert broken.returncode != 0 and 'pod="drain-0"' in broken.stdout, broken.stdout


def _outage_test() -> str:
    """A hung engine beside a healthy exporter; Prometheus stores nothing from minute 60 to 70 (no staleness marker:
    Prometheus itself, or the agent that ships its samples, is down), then scrapes both again."""
    hung = {**TARGET, "instance": "10.20.0.1:9400", "pod": "hung-0"}
    healthy = {**TARGET, "instance": "10.20.0.2:9400", "pod": "ok-0"}
    engine = {**hung, "engine": "hung", "model": "omni", "stage": "talker"}
    values = "{}x59 _x10 {}x50"
    series = [
        ("up", hung, values.format(1, 1)),
        ("up", healthy, values.format(1, 1)),
        ("modelkv_engine_up", engine, values.format(0, 0)),
    ]
    held = Held("ModelKVSnapshotStale", 10, 120, ({**engine, "severity": "warning"},))
    test = {
        "rule_files": ["../modelkv-rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": selector(name, tuple(sorted(labels.items()))), "values": text}
                    for name, labels, text in series
                ],
                "promql_expr_test": [held.test()],
            }
        ],
    }
    return yaml.safe_dump(test, sort_keys=False, width=1000)


def test_a_hung_engine_stays_paged_through_ten_minutes_in_which_prometheus_stored_nothing(tmp_path: Path) -> None:
    """Its target's up is absent for the outage's last 5 minutes (past the lookback), as a deleted pod's is; every
    other exporter's is absent too, which tells the two apart. Without that test, the page resolves in the outage
    and fires again, a second page for one hang."""
    rules = RULES_FILE.read_text()
    assert IN_AN_OUTAGE in rules
    outage = {"outage.test.yaml": _outage_test()}
    kept = promtool(rules, outage, tmp_path / "kept")
    assert kept.returncode == 0, kept.stdout
    broken = promtool(rules.replace(IN_AN_OUTAGE, ""), outage, tmp_path / "broken")
    assert broken.returncode != 0 and 'engine="hung"' in broken.stdout, broken.stdout


def test_a_plateaus_jitter_is_not_a_rise_without_the_minimum_step(tmp_path: Path) -> None:
    """Rising by any amount instead of 20 MiB a step: the settled heap's 16 MiB of jitter sets the alert pending."""
    rules = RULES_FILE.read_text()
    assert rules.count(MIN_STEP) == 5
    story = story_file("story-oncall-b-cpu-warm-up-adapters-and-jitter.test.yaml")
    assert promtool(rules, story, tmp_path / "kept").returncode == 0
    broken = promtool(rules.replace(MIN_STEP, "> 0"), story, tmp_path / "broken")
    assert broken.returncode != 0 and 'engine="cpu-jitter"' in broken.stdout, broken.stdout


def ran_for(served: InThread, seconds: float) -> None:
    """Make the page judge as if the exporter had started ``seconds`` earlier (its clock, not ours, moves)."""
    pages = cast(FastAPI, served.server.config.app).state.pages
    pages.started = pages.source.clock() - seconds


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    (tmp_path / "spool").mkdir()
    return tmp_path / "spool"


@pytest.fixture
def served(spool: Path) -> Iterator[InThread]:
    """A real sidecar (uvicorn, the app, its probe listener) in a thread of this process, over an empty spool."""
    with serving_in_thread(SidecarConfig(spool, probe_port=free_port())) as running:
        yield running


def _no_engine_after(exposition: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """promtool's verdict on "ModelKVNoEnginePublishing fires after 31 minutes" over a sidecar that answers
    ``exposition`` at every scrape."""
    target = {**TARGET, "instance": "10.21.0.1:9400", "pod": "np-0", "severity": "warning"}
    test = {
        "rule_files": ["../modelkv-rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": scraped_series(exposition, 45, {**TARGET, "instance": "10.21.0.1:9400", "pod": "np-0"}),
                "promql_expr_test": [Quiet(NO_ENGINE, 0, 29).test(), Firing(NO_ENGINE, 31, (target,)).test()],
            }
        ],
    }
    return promtool(RULES_FILE.read_text(), {"no-engine.test.yaml": yaml.safe_dump(test, sort_keys=False)}, tmp_path)


def test_a_real_sidecar_with_no_engine_says_so_and_its_metrics_fire_the_alert(
    served: InThread, spool: Path, tmp_path: Path
) -> None:
    """An empty spool on a real sidecar: its /metrics (every spool_files state 0, the spool listed) fire
    ModelKVNoEnginePublishing after 30 minutes; its page waits that long, then leads with the finding and what to
    check, never "0 engines ok"; once an engine publishes, neither the alert nor the finding."""
    metrics = httpx.get(served.url + "/metrics").text
    assert "modelkv_exporter_spool_scan_success 1.0" in metrics
    assert all(f'modelkv_exporter_spool_files{{state="{s}"}} 0.0' in metrics for s in ("exported", "stale", "ended"))
    fired = _no_engine_after(metrics, tmp_path / "empty")
    assert fired.returncode == 0, fired.stdout

    page = httpx.get(served.url + "/").text
    assert "Waiting for an engine: no engine has published a snapshot into the spool in the 0 min" in page
    assert "engines ok" not in page
    ran_for(served, NO_ENGINE_SECONDS + 60)
    page = httpx.get(served.url + "/").text
    assert "Needs attention: no engine" in page and "engines ok" not in page
    assert "in the 31 min since this exporter started" in page
    assert "printenv VLLM_PLUGINS" in page and "import modelkv_exporter" in page and "MODELKV_SPOOL_DIR" in page
    assert "docs/runbook.md#modelkvnoenginepublishing" in page

    write_snapshot(spool, make_snapshot("e"))
    page = httpx.get(served.url + "/").text
    assert "no engine" not in page and "Nothing: 1 engine ok." in page
    published = _no_engine_after(httpx.get(served.url + "/metrics").text, tmp_path / "published")
    assert published.returncode != 0 and NO_ENGINE in published.stdout, published.stdout
