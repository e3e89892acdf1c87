"""Regenerate the pictures in docs/images/ from a live run.

Starts the demo's engines and the test scenario's simulated-GPU engines, the sidecar,
and a real Prometheus with the rule file; lets the simulated leak grow for a while,
then screenshots the landing page and draws the overview dashboard with the data its
queries return, in headless Chromium. Run from the repository root, after ``make test``:

    .venv/bin/python -m scripts.docs_images
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from dashboards.layout import Line, PanelData, format_value, layout_html, legend_text, page_size
from modelkv_exporter.demo.engines import start_engines
from modelkv_testbed.browser import chromium_run
from modelkv_testbed.processes import start_sidecar
from modelkv_testbed.prometheus import query, running_prometheus, scrape_config
from modelkv_testbed.promql import RULES_FILE, substitute
from modelkv_testbed.scenario import GIB, declared_peak, start_scenario

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
RUN_SECONDS = 100


def query_range(prometheus: str, promql: str, start: float, end: float) -> list[dict[str, Any]]:
    """A range query at a 2 s step."""
    params = {"query": promql, "start": str(start), "end": str(end), "step": "2"}
    response = httpx.get(prometheus + "/api/v1/query_range", params=params, timeout=30)
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result


def panel_data(prometheus: str, panel: dict[str, Any], start: float, end: float) -> PanelData:
    """What the panel's queries return over [start, end], shaped for the picture."""
    data = PanelData()
    for target in panel.get("targets", []):
        promql = substitute(target["expr"])
        if panel["type"] == "table":
            order = panel["transformations"][0]["options"]["indexByName"]
            rename = panel["transformations"][0]["options"]["renameByName"]
            data.columns = [rename.get(c, c) for c in sorted(order, key=order.get)]
            for series in query(prometheus, promql):
                labels = {**series["metric"], "Value": format_value(float(series["value"][1]), "bytes")}
                data.rows.append([labels.get(c, "") for c in sorted(order, key=order.get)])
            data.rows.sort(key=lambda row: row[0])
            continue
        for series in query_range(prometheus, promql, start, end):
            points = [(float(t), float(v)) for t, v in series["values"]]
            legend = legend_text(target.get("legendFormat", ""), series["metric"])
            data.lines.append(Line(legend, target["refId"], points))
    return data


def main() -> int:
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="modelkv-images-") as tmp_name:
        tmp = Path(tmp_name)
        spool = tmp / "spool"
        spool.mkdir()
        processes, stop = start_engines(str(spool), 1.0)
        scenario = start_scenario(spool)
        sidecar = start_sidecar(spool)
        target = sidecar.url.removeprefix("http://")
        job = (
            "  - job_name: modelkv-exporter\n"
            f"    static_configs: [{{targets: ['{target}'], labels: {{namespace: llm, pod: demo-0}}}}]\n"
        )
        config = scrape_config({}, rule_files=(RULES_FILE,), extra=job)
        try:
            with running_prometheus(tmp, config) as prometheus:
                start = time.time()
                low, high = declared_peak() // 2, declared_peak() + 3 * GIB // 2
                while (elapsed := time.time() - start) < RUN_SECONDS:
                    with scenario.leak.lock:
                        scenario.leak.live = int(low + (high - low) * min(elapsed / (RUN_SECONDS * 0.8), 1.0))
                    time.sleep(1)
                shot = chromium_run(
                    sidecar.url + "/", tmp, f"--screenshot={IMAGES / 'landing-page.png'}", "--window-size=1400,1500"
                )
                print(shot.stderr[-300:] if shot.returncode else "wrote docs/images/landing-page.png")
                end = time.time()
                for path in sorted((ROOT / "dashboards").glob("*.json")):
                    dashboard = json.loads(path.read_text())
                    data = {
                        p["title"]: panel_data(prometheus, p, start, end)
                        for p in dashboard["panels"]
                        if p["type"] != "row"
                    }
                    page = tmp / f"{path.stem}.html"
                    page.write_text(layout_html(dashboard, data))
                    width, height = page_size(dashboard)
                    image = IMAGES / f"{path.stem}.png"
                    chromium_run(page.as_uri(), tmp, f"--screenshot={image}", f"--window-size={width},{height}")
                    print(f"wrote {image.relative_to(ROOT)}")
        finally:
            scenario.stop()
            stop.set()
            for process in processes:
                process.join(timeout=15)
            sidecar.process.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
