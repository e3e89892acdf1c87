"""Documents with the memory breakdown's figures (the weights, the activation peak, the CUDA graph pools).

What the contract writes, the published schema admits and the sidecar's reader reads back whole; a
document from a writer before these fields still reads (no such parts); and the sidecar of the
commit before them, run from its own source, reads today's documents at the version it knows.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import jsonschema
import pytest

from modelkv_exporter.sidecar.breakdown import breakdown
from modelkv_exporter.sidecar.reader.decode import SnapshotError, parse_snapshot
from modelkv_testbed import ROOT
from tests.support.discovered import BREAKDOWN_SETTINGS

SCHEMA = json.loads((ROOT / "docs" / "snapshot.schema.json").read_text())
GOLDEN = ROOT / "tests" / "sidecar" / "golden" / "memory-breakdown"
TODAY = GOLDEN / "qwen3-vllm034-dp0.json"
OLDER = GOLDEN / "before-breakdown-dp0.json"
BEFORE_THE_FIELDS = "eafab1fe3f4b79e6ca400b5579b4bc34d695dc5b"
"""The last commit whose sidecar knows none of these fields."""


def test_a_document_with_the_figures_reads_back_equal_at_the_oldest_version() -> None:
    document = json.loads(TODAY.read_text())
    jsonschema.validate(document, SCHEMA)
    assert document["schema_version"] == 1, "additive fields: a version-1 sidecar reads it and ignores them"
    read = parse_snapshot(TODAY.read_bytes())
    assert json.loads(read.to_json()) == document
    assert (read.settings.weights_bytes, read.settings.cuda_graph_bytes) == (15 * 1024**3, 768 * 1024**2)


def test_an_older_writer_s_document_reads_without_those_parts() -> None:
    document = json.loads(OLDER.read_text())
    assert not set(BREAKDOWN_SETTINGS) & set(document["settings"])
    read = parse_snapshot(OLDER.read_bytes())
    parts = breakdown(read)
    assert parts is not None and not parts.parts and not parts.complete


@pytest.mark.parametrize("field", BREAKDOWN_SETTINGS)
@pytest.mark.parametrize("value", [-1, 1.5, "12", True])
def test_a_malformed_figure_is_rejected(field: str, value: object) -> None:
    document = json.loads(TODAY.read_text())
    document["settings"][field] = value
    with pytest.raises(SnapshotError, match=field):
        parse_snapshot(json.dumps(document).encode())


def _source_at(commit: str, into: Path) -> None:
    try:
        archive = subprocess.run(
            ["git", "archive", commit, "modelkv_exporter"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"commit {commit[:8]} is not in this checkout")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def test_the_sidecar_before_the_fields_reads_today_s_documents(tmp_path: Path) -> None:
    _source_at(BEFORE_THE_FIELDS, tmp_path)
    script = (
        "import sys\n"
        "from modelkv_exporter.sidecar.reader.decode import parse_snapshot\n"
        "from modelkv_exporter.sidecar.samples import engine_samples\n"
        "names = set()\n"
        "for path in sys.argv[1:]:\n"
        "    snapshot = parse_snapshot(open(path, 'rb').read())\n"
        "    engine_samples(snapshot, False, lambda n, l, v: names.add(n), lambda n, l: names.add(n), 16)\n"
        "print(' '.join(sorted(names)))\n"
    )
    documents = [str(path) for path in sorted(GOLDEN.glob("*.json"))]
    result = subprocess.run(
        [sys.executable, "-c", script, *documents],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    names = result.stdout.split()
    assert "modelkv_memory_process_gpu_bytes" in names and "modelkv_memory_breakdown_bytes" not in names
