"""docs/architecture.md is the map a newcomer reads: linked from the README, naming every part, every path in it real."""

from __future__ import annotations

import re

from modelkv_testbed import ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def named_paths(text: str) -> set[str]:
    """Every file or folder path written in backticks (with a slash, without spaces or wildcards)."""
    return {path for path in re.findall(r"`([\w./-]+/[\w./-]*)`", text) if not path.startswith(("http", "/"))}


def test_the_readme_and_the_development_guide_link_it() -> None:
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
    assert "(architecture.md)" in (ROOT / "docs" / "development.md").read_text()


def test_it_names_every_part_of_the_package() -> None:
    text = ARCHITECTURE.read_text()
    parts = [p.name for p in (ROOT / "modelkv_exporter").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert parts and [part for part in parts if f"| `{part}/` |" not in text] == []


def test_every_path_it_names_exists() -> None:
    missing = [
        path
        for path in sorted(named_paths(ARCHITECTURE.read_text()))
        if not (ROOT / path).exists() and not (ROOT / "modelkv_exporter" / path).exists()
    ]
    assert missing == []


def test_a_stale_path_is_caught() -> None:
    assert named_paths("see `engine/gone.py` and `tests/sidecar/`, not `MODELKV_X`") == {
        "engine/gone.py",
        "tests/sidecar/",
    }
