"""One catalogue: names follow the conventions, and the generated docs are up to date."""

from __future__ import annotations

import re

from modelkv_exporter.sidecar.catalogue import CATALOGUE, label_limit
from scripts.docgen import ENGINE, SETTINGS, expected_files
from tests.support import ROOT


def test_generated_docs_are_current() -> None:
    for path, content in expected_files(ROOT).items():
        assert path.read_text() == content, f"{path.name} is stale: run python scripts/docgen.py"


def test_metric_names_follow_the_house_rules() -> None:
    for metric in CATALOGUE.values():
        assert re.fullmatch(r"modelkv_[a-z0-9_]+", metric.name), metric.name
        assert ":" not in metric.name
        assert len(metric.labels) <= label_limit(metric)
        assert not {"pod", "namespace"} & set(metric.labels)
        if metric.kind == "counter":
            assert metric.name.endswith("_total")
        if metric.kind == "info":
            assert metric.name.endswith("_info")
        if "bytes" in metric.name:
            assert metric.name.endswith("_bytes"), metric.name
        if "seconds" in metric.name:
            assert metric.name.endswith("_seconds"), metric.name


def test_every_setting_and_metric_is_documented() -> None:
    readme = (ROOT / "README.md").read_text()
    metrics_doc = (ROOT / "docs" / "metrics.md").read_text()
    for setting in SETTINGS:
        assert setting.env in readme
        if set(setting.defaults) - {ENGINE}:
            assert setting.flag in readme
    for name in CATALOGUE:
        assert f"`{name}`" in metrics_doc


def test_the_readme_names_every_part_of_the_package() -> None:
    readme = (ROOT / "README.md").read_text()
    parts = [p.name for p in (ROOT / "modelkv_exporter").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert parts and all(f"`{part}/`" in readme or f"{part}/:" in readme for part in parts), parts
