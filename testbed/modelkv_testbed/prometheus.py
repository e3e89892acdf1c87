"""A real Prometheus (Debian's package) for the tests: configuration, process, queries."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx

from modelkv_testbed.processes import free_port, require_tool, serving


def scrape_config(jobs: Mapping[str, str], *, rule_files: tuple[Path, ...] = (), extra: str = "") -> str:
    """A Prometheus configuration scraping each job's base URL every second."""
    lines = ["global: {scrape_interval: 1s, evaluation_interval: 1s}"]
    if rule_files:
        lines.append("rule_files: [" + ", ".join(f"'{p}'" for p in rule_files) + "]")
    lines.append("scrape_configs:")
    for job, url in jobs.items():
        lines.append(f"  - job_name: {job}\n    static_configs: [{{targets: ['{url.removeprefix('http://')}']}}]")
    return "\n".join(lines) + "\n" + extra


@contextmanager
def running_prometheus(tmp_path: Path, config: str) -> Iterator[str]:
    """A real Prometheus (the Debian package) on 127.0.0.1 with ``config``; yields its base URL."""
    binary = require_tool("prometheus")
    port = free_port()
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(config)
    command = [
        binary,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with serving(command, port, "/-/ready") as url:
        yield url


def query(prometheus: str, promql: str, at: float | None = None) -> list[dict]:
    """An instant query through Prometheus's HTTP API; fails the test on an error response."""
    params = {"query": promql} if at is None else {"query": promql, "time": str(at)}
    response = httpx.get(prometheus + "/api/v1/query", params=params, timeout=10)
    assert response.status_code == 200, f"{promql}: {response.text}"
    result: list[dict] = response.json()["data"]["result"]
    return result
