"""One catalogue: names follow the conventions, and the generated docs are up to date."""

from __future__ import annotations

import re

from modelkv_exporter.sidecar.catalogue import CATALOGUE, label_limit
from modelkv_testbed import ROOT
from scripts.docgen import ENGINE, SETTINGS, expected_files


def test_generated_docs_are_current() -> None:
    for path, content in expected_files(ROOT).items():
        assert path.read_text() == content, f"{path.name} is stale: run python -m scripts.docgen"


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
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    metrics_doc = (ROOT / "docs" / "metrics.md").read_text()
    assert "docs/configuration.md" in (ROOT / "README.md").read_text(), "the README points at every setting"
    for setting in SETTINGS:
        assert setting.env in configuration
        if set(setting.defaults) - {ENGINE}:
            assert setting.flag in configuration
    for name in CATALOGUE:
        assert f"`{name}`" in metrics_doc


def test_the_development_guide_names_every_part_of_the_package() -> None:
    guide = (ROOT / "docs" / "development.md").read_text()
    parts = [p.name for p in (ROOT / "modelkv_exporter").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert parts and all(f"`{part}/`" in guide or f"{part}/:" in guide for part in parts), parts
    assert "docs/development.md" in (ROOT / "README.md").read_text()


def test_the_readme_sets_up_with_two_commands() -> None:
    """A newcomer's first block is the two commands, each with its own set-up, before anything about the package's
    insides; every ``make`` command the README shows is one of them."""
    readme = (ROOT / "README.md").read_text()
    first = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first.splitlines()] == ["make demo", "make test"]
    assert readme.index("## Two commands") < readme.index("## What you see") < readme.index("## Where to go next")
    assert "one folder per part" not in readme and "settings:begin" not in readme, "contributor detail is in docs"
    assert set(re.findall(r"\bmake \w+", readme)) == {"make demo", "make test"}
