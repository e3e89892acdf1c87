"""Write every story's promtool test file: ``python -m modelkv_testbed.simulation.generate``."""

from __future__ import annotations

import sys
from pathlib import Path

from modelkv_testbed import ROOT
from modelkv_testbed.simulation.stories import STORIES

TESTS = ROOT / "deploy" / "prometheus" / "tests"


def expected_files() -> dict[Path, str]:
    """Each story's test file and its text."""
    return {TESTS / f"{story.name}.test.yaml": story.text() for story in STORIES}


def main() -> int:
    """Write the files; print each path."""
    for path, text in expected_files().items():
        path.write_text(text)
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
