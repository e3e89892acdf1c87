"""What the rules cost a Prometheus that watches a fleet: each rule group's evaluation time and memory.

A real Prometheus scrapes synthetic targets: one threaded HTTP server answers a path per pod,
each with the exposition a sidecar renders for four engines (``testbed/modelkv_testbed/simulation``: the
sidecar's own sample functions over simulated snapshots): a thinker and a talker sharing a GPU,
both declaring observed caches (the talker keeps an undeclared one that discovery finds), a
code2wav stage on a second GPU and a CPU vocoder. Before Prometheus starts, a day of history of
the series the rules read over a day (``modelkv_engine_declarations``, and the recorded
``modelkv_engine:declarations_by_model:max``) is backfilled with promtool. Once the targets have
been scraped and the rules evaluated a few times, it prints every group's last and average
evaluation time against its interval, Prometheus's memory and head series; and, side by side in
the same Prometheus, the day-long declarations rule as it was before (a day of every engine's
series) and as it is now (a day of one recorded series per model and stage).

Which rules dominate: every rule's evaluation time (``/api/v1/rules``) is collected at each
evaluation, and afterwards every rule's expression is run once more as an instant query, counted so
that encoding the answer costs nothing (the least of three wall times: its cost with the least
waiting for a core). Prometheus's own CPU use over the evaluations is printed too: what the fleet
costs it, whichever way the rules are grouped. ``--before REVISION`` evaluates
the rule file of that git revision, renamed, beside today's in the same Prometheus;
``--candidates FILE`` adds rewrites under trial (``bench/rules_candidates.yaml``).

    .venv/bin/python -m bench.rules_fleet --engines 1000 10000
    .venv/bin/python -m bench.rules_fleet --engines 10000 --before ddce8b2 --candidates bench/rules_candidates.yaml
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from modelkv_testbed.bench_tables import RECORD_HELP, recorded
from modelkv_testbed.processes import free_port
from modelkv_testbed.simulation.physics import GIB, MIB, Cache, Device, Engine, Undeclared, flat, ramp, simulate
from modelkv_testbed.simulation.render import Labels, scrapes

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "modelkv-rules.yaml"
ENGINES_PER_POD = 4
SLOWEST = 20
MODELS = 50
TARGET_LABELS = {"job", "instance", "namespace", "pod"}
DECLARATIONS_BEFORE = """
groups:
  - name: bench.declarations_before
    rules:
      - record: bench_declarations_fewer_than_before
        expr: |
          modelkv_engine_declarations
          < on (namespace, model, stage) group_left
          max by (namespace, model, stage) (max_over_time(modelkv_engine_declarations[1d]))
  - name: bench.declarations_after
    rules:
      - record: bench_declarations_fewer_than_before
        expr: |
          modelkv_engine_declarations
          < on (namespace, model, stage) group_left
          max_over_time(modelkv_engine:declarations_by_model:max[1d])
"""
"""The ModelKVDeclarationsDropped (fewer_than_before) expression as it was, and as it is."""
BEFORE_PREFIX = "before."


def rules_before(revision: str) -> str:
    """The rule file at a git revision, renamed so that it evaluates beside today's in one Prometheus.

    Its groups are prefixed ``before.``, its recorded series ``bench_before_``, its alerts ``BenchBefore``;
    it reads the same scraped series and writes none of today's.
    """
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:{RULES.relative_to(ROOT)}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return (
        text.replace("modelkv_engine:", "bench_before_modelkv_engine:")
        .replace("- name: modelkv.", f"- name: {BEFORE_PREFIX}modelkv.")
        .replace("- alert: ModelKV", "- alert: BenchBeforeModelKV")
    )


def instance(pod: int) -> str:
    """The pod's exporter address (unique per pod, as scrape discovery gives it)."""
    return f"10.{pod // 65536 % 256}.{pod // 256 % 256}.{pod % 256}:9400"


MODEL, POD = "omni-@model@", "@pod@"
"""Placeholders: one pod's exposition is rendered once and becomes every pod's by substitution."""


def pod_engines(leaking: bool) -> list[Engine]:
    """The four engines of one vLLM-Omni pod (its thinker leaking, or not)."""
    model, host, name = MODEL, "10.0.0.1:9400", f"omni-{POD}"
    shared, second = Device(f"GPU-{POD}-0000-4000-8000-00000000000a"), Device(f"GPU-{POD}-0000-4000-8000-00000000000b")
    common = {"started": -12, "load_minutes": 10, "model": model}
    leak = ramp(0, 64 * MIB) if leaking else flat()
    return [
        Engine(
            "thinker-0",
            name,
            host,
            shared,
            stage="thinker",
            weights=8 * GIB,
            paged_kv=20 * GIB,
            caches=(
                Cache("thinker", "thinker_kv", 256 * MIB, flat(GIB)),
                Cache("thinker.mtp", "mtp_kv", 64 * MIB, flat(128 * MIB)),
            ),
            leak=leak,
            **common,  # type: ignore[arg-type]
        ),
        Engine(
            "talker-0",
            name,
            host,
            shared,
            stage="talker",
            weights=4 * GIB,
            paged_kv=20 * GIB,
            caches=(Cache("talker", "talker_kv", 128 * MIB, flat(512 * MIB)),),
            undeclared=(Undeclared("talker.code_predictor", flat(200 * MIB)),),
            **common,  # type: ignore[arg-type]
        ),
        Engine(
            "code2wav-0",
            name,
            host,
            second,
            stage="code2wav",
            weights=2 * GIB,
            paged_kv=10 * GIB,
            undeclared=(Undeclared("decoder", flat(96 * MIB)),),
            **common,  # type: ignore[arg-type]
        ),
        Engine(
            "vocoder-0",
            name,
            host,
            None,
            stage="vocoder",
            caches=(Cache("vocoder", "state", 32 * MIB, flat(64 * MIB)),),
            **common,  # type: ignore[arg-type]
        ),
    ]


def _line(name: str, labels: Labels, value: float) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels if k not in TARGET_LABELS)
    number = repr(value) if value != int(value) else str(int(value))
    return f"{name}{{{inner}}} {number}\n" if inner else f"{name} {number}\n"


def templates(leaking: bool) -> tuple[list[str], dict[str, int]]:
    """Two successive expositions of one pod's sidecar (with placeholders), and each engine's declarations."""
    engines = pod_engines(leaking)
    timeline = simulate(engines, 3)
    texts = [
        "".join(_line(n, labels, v) for (n, labels), v in scrape.items() if n not in ("up", "scrape_duration_seconds"))
        for minute, scrape in enumerate(scrapes(engines, timeline, 3))
        if minute >= 2
    ]
    return texts, {e.engine_id: len(e.caches) for e in engines}


def expositions(pod: int, texts: list[str]) -> list[bytes]:
    """The pod's two gzip'd expositions."""
    return [
        gzip.compress(t.replace(MODEL, f"omni-{pod % MODELS}").replace(POD, f"{pod:06d}").encode(), 1) for t in texts
    ]


class Targets(ThreadingHTTPServer):
    """Serves ``/pod/<n>``: the pod's exposition, alternating between two scrapes' worth."""

    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, bodies: list[list[bytes]], interval: float) -> None:
        self.bodies, self.interval = bodies, interval
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Targets

    def do_GET(self) -> None:
        pod = int(self.path.rsplit("/", 1)[-1])
        variants = self.server.bodies[pod]
        body = variants[int(time.time() / self.server.interval) % len(variants)]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def backfill(pods: int, declarations: dict[str, int], directory: Path, interval: int, now: float) -> float:
    """A day of history of the series read over a day, as TSDB blocks in ``directory``; seconds it took."""
    started = time.perf_counter()
    source = directory.parent / "history.om"
    first, last = int(now) - 86400, int(now) - 2 * interval
    stamps = [str(t) for t in range(first - first % interval, last, interval)]
    with source.open("w") as out:
        out.write("# TYPE modelkv_engine_declarations gauge\n")
        for pod in range(pods):
            target = f'instance="{instance(pod)}",job="modelkv-exporter",namespace="llm",pod="omni-{pod}"'
            for engine, count in declarations.items():
                stage = engine.split("-")[0]
                prefix = f'modelkv_engine_declarations{{{target},engine="{engine}",model="omni-{pod % MODELS}",stage="{stage}"}} {count} '
                out.write("".join(f"{prefix}{t}\n" for t in stamps))
        out.write("# TYPE modelkv_engine:declarations_by_model:max gauge\n")
        for model in range(min(pods, MODELS)):
            for engine, count in declarations.items():
                stage = engine.split("-")[0]
                prefix = f'modelkv_engine:declarations_by_model:max{{model="omni-{model}",namespace="llm",stage="{stage}"}} {count} '
                out.write("".join(f"{prefix}{t}\n" for t in stamps))
        out.write("# EOF\n")
    subprocess.run(
        [
            shutil.which("promtool") or "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(source),
            str(directory),
        ],
        check=True,
        capture_output=True,
    )
    source.unlink()
    return time.perf_counter() - started


def config(port: int, self_port: int, pods: int, interval: int, extra_rules: list[Path]) -> str:
    """The Prometheus configuration: one target per pod, the rules, and Prometheus scraping itself."""
    targets = ",".join(
        f"{{targets: ['127.0.0.1:{port}'], labels: {{__metrics_path__: /pod/{pod}, instance: '{instance(pod)}', "
        f"namespace: llm, pod: omni-{pod}}}}}"
        for pod in range(pods)
    )
    return (
        f"global: {{scrape_interval: {interval}s, evaluation_interval: {interval}s, scrape_timeout: {interval // 2}s}}\n"
        f"rule_files: {[str(RULES), *map(str, extra_rules)]}\n"
        "scrape_configs:\n"
        f"  - job_name: modelkv-exporter\n    static_configs: [{targets}]\n"
        f"  - job_name: prometheus\n    static_configs: [{{targets: ['127.0.0.1:{self_port}']}}]\n"
    )


def query(url: str, promql: str) -> list[dict]:
    """An instant query's result."""
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), timeout=60) as r:
        result: list[dict] = json.load(r)["data"]["result"]
        return result


def alone_times(url: str, text: str, repeats: int) -> dict[tuple[str, str], float]:
    """Each rule's expression as an instant query, the least of ``repeats`` wall times: its cost with the least waiting.

    The expression is counted (``count(...)``), so that the time is the evaluation's, not the answer's encoding.
    """
    at = time.time()
    times: dict[tuple[str, str], float] = {}
    for group in yaml.safe_load(text)["groups"]:
        for index, rule in enumerate(group["rules"]):
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                with urllib.request.urlopen(
                    f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": f"count({rule['expr']})", "time": at}),
                    timeout=120,
                ) as response:
                    response.read()
                best = min(best, time.perf_counter() - started)
            name = (rule.get("record") or rule["alert"]).replace("bench_before_", "").replace("BenchBefore", "")
            times[(group["name"], f"{index:02d} {name}")] = best
    return times


def record_rule_times(url: str, per_rule: dict[tuple[str, int, str], dict[str, float]]) -> None:
    """Add each rule's latest evaluation time (``/api/v1/rules``), keyed by the evaluation's timestamp."""
    with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=60) as response:
        listed = json.load(response)["data"]["groups"]
    for group in listed:
        for index, rule in enumerate(group["rules"]):
            if rule.get("lastEvaluation", "").startswith("0001"):
                continue
            times = per_rule.setdefault((group["name"], index, rule["name"]), {})
            times[rule["lastEvaluation"]] = rule["evaluationTime"]


def measure(
    engines: int, interval: int, evaluations: int, before: str | None, candidates: list[Path]
) -> dict[str, object]:
    """Run Prometheus over ``engines`` engines until the rules have been evaluated ``evaluations`` times."""
    pods = engines // ENGINES_PER_POD
    started = time.perf_counter()
    (plain, declarations), (leaking, _) = templates(False), templates(True)
    bodies = [expositions(pod, leaking if pod % 100 == 0 else plain) for pod in range(pods)]
    series = plain[0].count("\n") * pods
    rendered = time.perf_counter() - started
    server = Targets(bodies, interval)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="rules-fleet-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        backfilled = backfill(pods, declarations, data, interval, time.time())
        extra = [Path(tmp) / "declarations.yaml"]
        extra[0].write_text(DECLARATIONS_BEFORE)
        if before:
            extra.append(Path(tmp) / "before.yaml")
            extra[1].write_text(rules_before(before))
        extra += candidates
        self_port = free_port()
        (Path(tmp) / "prometheus.yml").write_text(config(server.server_address[1], self_port, pods, interval, extra))
        process = subprocess.Popen(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={tmp}/prometheus.yml",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self_port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{self_port}"
        try:
            deadline = time.time() + interval * (evaluations + 3) + 120
            per_rule: dict[tuple[str, int, str], dict[str, float]] = {}
            while time.time() < deadline:
                time.sleep(5)
                try:
                    done = query(url, "min(prometheus_rule_group_iterations_total)")
                    record_rule_times(url, per_rule)
                except OSError:
                    continue
                if done and float(done[0]["value"][1]) >= evaluations:
                    break
            window = f"{interval * (evaluations - 1)}s"
            groups = {
                r["metric"]["rule_group"].rsplit(";", 1)[-1]: (
                    float(r["value"][1]),
                    float(
                        query(
                            url,
                            f'max_over_time(prometheus_rule_group_last_duration_seconds{{rule_group="{r["metric"]["rule_group"]}"}}[{window}])',
                        )[0]["value"][1]
                    ),
                )
                for r in query(url, f"avg_over_time(prometheus_rule_group_last_duration_seconds[{window}])")
            }
            memory = {
                name: float(query(url, f'{promql}{{job="prometheus"}}')[0]["value"][1])
                for name, promql in (
                    ("resident", "process_resident_memory_bytes"),
                    ("heap", "go_memstats_heap_inuse_bytes"),
                )
            }
            head = float(query(url, "prometheus_tsdb_head_series")[0]["value"][1])
            cpu = float(query(url, f'rate(process_cpu_seconds_total{{job="prometheus"}}[{window}])')[0]["value"][1])
            record_rule_times(url, per_rule)
            slowest = sorted(
                (
                    (sum(times.values()) / len(times), max(times.values()), group, name)
                    for (group, _, name), times in per_rule.items()
                    if times
                ),
                reverse=True,
            )[:SLOWEST]
            alone = alone_times(url, RULES.read_text(), 3)
            for candidate in candidates:
                alone.update(alone_times(url, candidate.read_text(), 3))
            alone_before = alone_times(url, rules_before(before), 3) if before else {}
            scraped = query(url, 'count(up{job="modelkv-exporter"} == 1)')
            load = os.getloadavg()
        finally:
            process.terminate()
            process.wait(timeout=60)
            server.shutdown()
    return {
        "engines": engines,
        "pods": pods,
        "series_per_scrape": series,
        "targets_up": int(float(scraped[0]["value"][1])) if scraped else 0,
        "groups": groups,
        "slowest": slowest,
        "memory": memory,
        "head_series": head,
        "cpu": cpu,
        "render_s": rendered,
        "backfill_s": backfilled,
        "load": load,
        "alone": alone,
        "alone_before": alone_before,
    }


def report(result: dict[str, object], interval: int, before: str | None) -> None:
    """Print one fleet size's figures (with the rules at ``before`` beside today's, where given)."""
    groups: dict[str, tuple[float, float]] = result["groups"]  # type: ignore[assignment]
    memory: dict[str, float] = result["memory"]  # type: ignore[assignment]
    print(
        f"\n{result['engines']} engines ({result['pods']} pods, {result['targets_up']} targets up), "
        f"{result['series_per_scrape']} series a scrape, {result['head_series']:.0f} head series; "
        f"Prometheus resident {memory['resident'] / GIB:.2f} GiB, Go heap in use {memory['heap'] / GIB:.2f} GiB; "
        f"load average at the end {' / '.join(f'{x:.1f}' for x in result['load'])}"  # type: ignore[attr-defined]
    )
    print(
        f"Prometheus used {result['cpu']:.2f} of a core (scrapes, rules, compaction, everything); "
        f"the rule groups' evaluations summed: {sum(mean for mean, _ in groups.values()):.1f} s a {interval} s interval"
    )
    print(f"| rule group | mean s | max s | share of the {interval} s interval (max) |")
    print("|---|---:|---:|---:|")
    for name, (mean, peak) in sorted(groups.items()):
        print(f"| {name} | {mean:.3f} | {peak:.3f} | {100 * peak / interval:.1f} % |")
    if before:
        print(f"| rule group | rules at {before}: mean s | today's: mean s | ratio |")
        print("|---|---:|---:|---:|")
        for name, (mean, _) in sorted(groups.items()):
            if name.startswith(BEFORE_PREFIX) and name[len(BEFORE_PREFIX) :] in groups:
                now = groups[name[len(BEFORE_PREFIX) :]][0]
                print(f"| {name[len(BEFORE_PREFIX) :]} | {mean:.3f} | {now:.3f} | {mean / now:.1f}× |")
    alone: dict[tuple[str, str], float] = result["alone"]  # type: ignore[assignment]
    alone_before: dict[tuple[str, str], float] = result["alone_before"]  # type: ignore[assignment]
    print("each rule's expression as one instant query afterwards (least of 3 wall times), summed per group:")
    print("| rule group | rules at the revision given | today's |")
    print("|---|---:|---:|")
    for name in sorted({g for g, _ in alone}):
        earlier = sum(t for (g, _), t in alone_before.items() if g == BEFORE_PREFIX + name)
        now = sum(t for (g, _), t in alone.items() if g == name)
        print(f"| {name} | {earlier:.3f} | {now:.3f} |")
    print(
        f"the {SLOWEST} costliest rules alone (s; at the revision given, where it has a rule of that place and name):"
    )
    for (group, rule), seconds in sorted(alone.items(), key=lambda item: -item[1])[:SLOWEST]:
        was = alone_before.get((BEFORE_PREFIX + group, rule))
        print(f"  {seconds:.3f}  {'' if was is None else f'(before {was:.3f})'}  {group}  {rule}")
    print(f"the {SLOWEST} slowest rules (mean / max s over every evaluation seen):")
    for mean, peak, group, rule in result["slowest"]:  # type: ignore[attr-defined]
        print(f"  {mean:.3f} / {peak:.3f} s  {group}  {rule}")


def main() -> int:
    """Measure each fleet size given; print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    parser.add_argument("--engines", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--interval", type=int, default=60, help="scrape and evaluation interval, seconds")
    parser.add_argument("--evaluations", type=int, default=4, help="rule evaluations to average over")
    parser.add_argument(
        "--before", metavar="REVISION", help="also evaluate the rule file at this git revision, renamed, beside today's"
    )
    parser.add_argument(
        "--candidates",
        type=Path,
        nargs="*",
        default=[],
        help="rule files to evaluate beside the rules (rewrites under trial; they must record names of their own)",
    )
    args = parser.parse_args()
    for engines in args.engines:
        result = measure(engines, args.interval, args.evaluations, args.before, args.candidates)
        report(result, args.interval, args.before)
    return 0


if __name__ == "__main__":
    with recorded("rules_fleet", "--record" in sys.argv[1:]):
        status = main()
    sys.exit(status)
