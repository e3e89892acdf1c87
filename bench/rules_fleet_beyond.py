"""What the rules cost past one Prometheus: one Prometheus, Prometheus sharded by pod, and vmalert, side by side.

The fleet of ``bench/rules_fleet.py`` (its synthetic targets, four engines a pod) is watched three
ways in one run, one after the other, for each fleet size:

- ``single``: one Prometheus scraping every pod and evaluating every group;
- ``sharded``: ``--shards`` Prometheus processes, each scraping a ``hashmod`` share of the pods and
  evaluating every group but ``modelkv.fleet``, and a fleet Prometheus federating what that group
  reads from each shard and evaluating it alone (docs/deploy.md, "Sharded Prometheus"); a bench
  pod has devices of its own, so a share of the pods is a share of the nodes here;
- ``vmalert``: one victoria-metrics scraping every pod, and vmalert evaluating the rule file
  (without ``keep_firing_for``, which Debian's 1.79 rejects) over it, writing back to it.

Printed for each: every process's resident memory, the largest group's mean and largest
evaluation time (Prometheus: ``prometheus_rule_group_last_duration_seconds``; vmalert:
``vmalert_iteration_duration_seconds``), and the CPU the processes took. No day of history is
backfilled (``rules_fleet.py`` does): the day-long windows read what was scraped.

    .venv/bin/python -m bench.rules_fleet_beyond --engines 10000 40000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.rules_fleet import ENGINES_PER_POD, RULES, Targets, expositions, instance, query, templates
from modelkv_testbed.bench_tables import RECORD_HELP, recorded
from modelkv_testbed.processes import free_port
from modelkv_testbed.simulation.physics import GIB

ROOT = Path(__file__).resolve().parents[1]
FLEET_GROUPS = ("modelkv.fleet",)
MODES = ("single", "sharded", "vmalert")


@dataclass
class Figures:
    """One mode's figures: each process's resident bytes, each group's (mean, max) seconds, CPU in cores."""

    mode: str
    resident: dict[str, float] = field(default_factory=dict)
    groups: dict[str, tuple[float, float]] = field(default_factory=dict)
    cpu: float = 0.0
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)


def _targets(port: int, pods: list[int]) -> str:
    return ",".join(
        f"{{targets: ['127.0.0.1:{port}'], labels: {{__metrics_path__: /pod/{pod}, instance: '{instance(pod)}', "
        f"namespace: llm, pod: omni-{pod}}}}}"
        for pod in pods
    )


def _rules(directory: Path, name: str, fleet: bool) -> Path:
    """The rule file's fleet groups (``fleet``) or every other group."""
    document = yaml.safe_load(RULES.read_text())
    document["groups"] = [g for g in document["groups"] if (g["name"] in FLEET_GROUPS) == fleet]
    path = directory / name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _no_keep_firing_for(directory: Path) -> Path:
    path = directory / "vmalert-rules.yaml"
    path.write_text(re.sub(r"^ *keep_firing_for: .*\n", "", RULES.read_text(), flags=re.M))
    return path


@contextlib.contextmanager
def _process(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def _prometheus(directory: Path, config: str, port: int) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    directory.mkdir()
    (directory / "prometheus.yml").write_text(config)
    return _process(
        [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
    )


def _wait_evaluations(urls: list[str], evaluations: int, interval: int) -> None:
    deadline = time.time() + interval * (evaluations + 4) + 300
    while time.time() < deadline:
        time.sleep(5)
        try:
            done = [query(url, "min(prometheus_rule_group_iterations_total)") for url in urls]
        except OSError:
            continue
        if all(d and float(d[0]["value"][1]) >= evaluations for d in done):
            return


def _prometheus_figures(figures: Figures, name: str, url: str, window: str) -> None:
    figures.resident[name] = float(query(url, 'process_resident_memory_bytes{job="prometheus"}')[0]["value"][1])
    figures.cpu += float(query(url, f'rate(process_cpu_seconds_total{{job="prometheus"}}[{window}])')[0]["value"][1])
    for r in query(url, f"avg_over_time(prometheus_rule_group_last_duration_seconds[{window}])"):
        group = r["metric"]["rule_group"].rsplit(";", 1)[-1]
        peak = query(url, f'max_over_time(prometheus_rule_group_last_duration_seconds{{rule_group="{r["metric"]["rule_group"]}"}}[{window}])')  # fmt: skip
        figures.groups[f"{group} ({name})"] = (float(r["value"][1]), float(peak[0]["value"][1]))


def _self_job(port: int) -> str:
    return f"  - job_name: prometheus\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"


def single(tmp: Path, port: int, pods: int, interval: int, evaluations: int) -> Figures:
    """One Prometheus, every pod, every group."""
    figures, self_port = Figures("single"), free_port()
    config = (
        f"global: {{scrape_interval: {interval}s, evaluation_interval: {interval}s, scrape_timeout: {interval // 2}s}}\n"
        f"rule_files: ['{RULES}']\nscrape_configs:\n"
        f"  - job_name: modelkv-exporter\n    static_configs: [{_targets(port, list(range(pods)))}]\n"
        + _self_job(self_port)
    )
    with _prometheus(tmp / "single", config, self_port):
        url = f"http://127.0.0.1:{self_port}"
        _wait_evaluations([url], evaluations, interval)
        _prometheus_figures(figures, "one", url, f"{interval * (evaluations - 1)}s")
    figures.load = os.getloadavg()
    return figures


def sharded(tmp: Path, port: int, pods: int, interval: int, evaluations: int, shards: int) -> Figures:
    """``shards`` Prometheus processes over hashmod shares of the pods, and the fleet's over federation."""
    figures = Figures("sharded")
    shard_rules = _rules(tmp, "shard-rules.yaml", fleet=False)
    fleet_rules = _rules(tmp, "fleet-rules.yaml", fleet=True)
    ports = [free_port() for _ in range(shards + 1)]
    head = f"global: {{scrape_interval: {interval}s, evaluation_interval: {interval}s, scrape_timeout: {interval // 2}s}}\n"
    with contextlib.ExitStack() as stack:
        for k in range(shards):
            config = (
                f"{head}rule_files: ['{shard_rules}']\nscrape_configs:\n"
                f"  - job_name: modelkv-exporter\n    static_configs: [{_targets(port, list(range(pods)))}]\n"
                f"    relabel_configs:\n"
                f"      - {{source_labels: [pod], modulus: {shards}, target_label: __tmp_shard, action: hashmod}}\n"
                f"      - {{source_labels: [__tmp_shard], regex: '{k}', action: keep}}\n" + _self_job(ports[k])
            )
            stack.enter_context(_prometheus(tmp / f"shard-{k}", config, ports[k]))
        shard_targets = ", ".join(f"'127.0.0.1:{p}'" for p in ports[:shards])
        fleet = (
            f"{head}rule_files: ['{fleet_rules}']\nscrape_configs:\n"
            "  - job_name: federate\n    honor_labels: true\n    metrics_path: /federate\n"
            "    params: {'match[]': ['{__name__=\"modelkv_engine_declarations\"}', "
            "'up{job=\"modelkv-exporter\"}']}\n"
            f"    static_configs: [{{targets: [{shard_targets}]}}]\n" + _self_job(ports[shards])
        )
        stack.enter_context(_prometheus(tmp / "fleet", fleet, ports[shards]))
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        _wait_evaluations(urls, evaluations, interval)
        for k, url in enumerate(urls):
            _prometheus_figures(
                figures, f"shard {k}" if k < shards else "fleet", url, f"{interval * (evaluations - 1)}s"
            )
    figures.load = os.getloadavg()
    return figures


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=60) as response:
        text: str = response.read().decode()
        return text


def _sample(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, flags=re.M)
    return float(found[1]) if found else 0.0


def _iterations(text: str) -> dict[str, tuple[float, float]]:
    """Each group's mean and largest (quantile 1 of vmalert's summary) evaluation seconds."""
    found: dict[str, dict[str, float]] = {}
    pattern = (
        r'^vmalert_iteration_duration_seconds(_sum|_count|)\{group="([^"]+)"[^}]*?(?:quantile="([^"]+)")?\} (\S+)$'
    )
    for kind, group, quantile, value in re.findall(pattern, text, flags=re.M):
        found.setdefault(group, {})[kind or quantile] = float(value)
    return {g: (v.get("_sum", 0.0) / max(v.get("_count", 1.0), 1.0), v.get("1", 0.0)) for g, v in found.items()}


def vmalert(tmp: Path, port: int, pods: int, interval: int, evaluations: int) -> Figures:
    """victoria-metrics scraping every pod, vmalert evaluating the rule file over it."""
    figures = Figures("vmalert")
    vm_port, alert_port = free_port(), free_port()
    scrape = tmp / "scrape.yml"
    scrape.write_text(
        f"global: {{scrape_interval: {interval}s, scrape_timeout: {interval // 2}s}}\nscrape_configs:\n"
        f"  - job_name: modelkv-exporter\n    static_configs: [{_targets(port, list(range(pods)))}]\n"
    )
    vm, alerting = f"http://127.0.0.1:{vm_port}", f"http://127.0.0.1:{alert_port}"
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            _process(
                [
                    shutil.which("victoria-metrics") or "victoria-metrics",
                    f"-storageDataPath={tmp / 'vm'}",
                    f"-httpListenAddr=127.0.0.1:{vm_port}",
                    f"-promscrape.config={scrape}",
                    "-loggerLevel=ERROR",
                ]
            )
        )
        evaluator = stack.enter_context(
            _process(
                [
                    shutil.which("vmalert") or "vmalert",
                    f"-rule={_no_keep_firing_for(tmp)}",
                    f"-datasource.url={vm}",
                    f"-remoteWrite.url={vm}",
                    f"-evaluationInterval={interval}s",
                    f"-httpListenAddr=127.0.0.1:{alert_port}",
                    f"-notifier.url=http://127.0.0.1:{free_port()}",
                    "-loggerLevel=ERROR",
                ]
            )
        )
        started = time.time()
        cpu_start: dict[str, float] = {}
        deadline = started + interval * (evaluations + 4) + 300
        while time.time() < deadline:
            time.sleep(5)
            assert evaluator.poll() is None, f"vmalert exited with {evaluator.returncode}"
            try:
                text = _metrics(alerting)
            except OSError:
                continue
            counts = [
                float(c) for c in re.findall(r"^vmalert_iteration_duration_seconds_count\{[^}]*\} (\S+)$", text, re.M)
            ]
            if counts and not cpu_start:
                cpu_start = {"vm": _sample(_metrics(vm), "process_cpu_seconds_total"), "vmalert": _sample(text, "process_cpu_seconds_total"), "at": time.time()}  # fmt: skip
            if counts and min(counts) >= evaluations:
                break
        vm_text, alert_text = _metrics(vm), _metrics(alerting)
        elapsed = time.time() - cpu_start.get("at", started)
        for name, text in (("victoria-metrics", vm_text), ("vmalert", alert_text)):
            figures.resident[name] = _sample(text, "process_resident_memory_bytes")
        figures.cpu = (
            _sample(vm_text, "process_cpu_seconds_total")
            - cpu_start.get("vm", 0.0)
            + _sample(alert_text, "process_cpu_seconds_total")
            - cpu_start.get("vmalert", 0.0)
        ) / max(elapsed, 1.0)
        figures.groups = _iterations(alert_text)
    figures.load = os.getloadavg()
    return figures


def report(engines: int, pods: int, interval: int, results: list[Figures]) -> None:
    """One table row per mode: memory (each process, and the largest), the largest group, CPU, load."""
    print(f"\n{engines} engines ({pods} pods), {interval} s interval")
    print("| engines | mode | resident: each process | largest process | largest group (mean / max s, share of the interval) | CPU | load average |")  # fmt: skip
    print("|---:|---|---|---:|---|---:|---|")
    for f in results:
        each = ", ".join(f"{name} {value / GIB:.2f}" for name, value in f.resident.items())
        largest = max(f.resident.values(), default=0.0) / GIB
        name, (mean, most) = max(f.groups.items(), key=lambda item: item[1][0], default=("-", (0.0, 0.0)))
        load = " / ".join(f"{x:.1f}" for x in f.load)
        print(
            f"| {engines:,} | {f.mode} | {each} GiB | {largest:.2f} GiB | {name}: {mean:.2f} / {most:.2f} s "
            f"({100 * most / interval:.1f} %) | {f.cpu:.2f} core | {load} |"
        )
    for f in results:
        print(f"{f.mode}, every group (mean / max s): " + "; ".join(f"{g} {m:.2f} / {x:.2f}" for g, (m, x) in sorted(f.groups.items())))  # fmt: skip


def main() -> int:
    """Measure each fleet size in each mode; print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    parser.add_argument("--engines", type=int, nargs="+", default=[10000, 40000])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--interval", type=int, default=60, help="scrape and evaluation interval, seconds")
    parser.add_argument("--evaluations", type=int, default=3, help="rule evaluations to average over")
    args = parser.parse_args()
    for engines in args.engines:
        pods = engines // ENGINES_PER_POD
        (plain, _), (leaking, _) = templates(False), templates(True)
        server = Targets([expositions(pod, leaking if pod % 100 == 0 else plain) for pod in range(pods)], args.interval)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        results = []
        try:
            for mode in args.modes:
                with tempfile.TemporaryDirectory(prefix=f"rules-beyond-{mode}-") as tmp:
                    if mode == "single":
                        results.append(single(Path(tmp), port, pods, args.interval, args.evaluations))
                    elif mode == "sharded":
                        results.append(sharded(Path(tmp), port, pods, args.interval, args.evaluations, args.shards))
                    else:
                        results.append(vmalert(Path(tmp), port, pods, args.interval, args.evaluations))
                print(f"{mode} done at {time.strftime('%H:%M:%S')}", file=sys.stderr)
        finally:
            server.shutdown()
        report(engines, pods, args.interval, results)
    return 0


if __name__ == "__main__":
    with recorded("rules_fleet_beyond", "--record" in sys.argv[1:]):
        status = main()
    sys.exit(status)
