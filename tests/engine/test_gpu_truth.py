"""bench/gpu_truth.py, the end-to-end check of measured against declared memory, on this machine's CPU.

On CUDA it compares torch's allocation growth with the caches' storage; here it runs the same
path (real owners, publisher, sampler, observer, sidecar, scrape) and must report every CUDA and
NVML source absent, the observed peak equal to the caches' storage, and nothing exported as 0.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import ModuleType

import pytest

from modelkv_testbed import ROOT

SCRIPT = ROOT / "bench" / "gpu_truth.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_truth", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_truth"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_script_passes_on_cpu_and_reports_the_cuda_sources_absent() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "NVML per-process figure for this PID: absent: no CUDA device" in result.stdout
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines() if line.startswith("| ") and "MiB" in line]
    assert [r[0].strip() for r in rows] == [case.engine_id for case in load().CASES]
    for engine, declared, held, counters, requested, allocated, reserved, nvml, _, _, observed in rows:
        assert declared == held == observed, engine
        assert counters.strip().endswith(" B"), engine
        assert requested.strip() == allocated.strip() == reserved.strip() == nvml.strip() == "absent", engine
    assert "torch's peak after the sampler's resets" not in result.stdout, "a CUDA-only section"
    assert result.stdout.rstrip().endswith("all checks passed")


def test_expecting_nvml_where_there_is_none_fails() -> None:
    """The NVML check can fail: here no engine has the figure, so expecting it is a failure per engine."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--expect-nvml", "present"], capture_output=True, text=True
    )
    assert result.returncode == 1
    failures = [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]
    assert len(failures) == len(load().CASES) - 1, "every engine that asks NVML for its own PID"
    assert all("NVML's process figure is None (available 0.0)" in line for line in failures)


def test_the_allocator_slack_allows_a_large_blocks_unsplit_remainder() -> None:
    """Seen on an H200: a cold allocator handed a 66.6 MiB cache 1.2 MiB more than its storages."""
    truth = load()
    assert truth.allocator_slack([8]) == 512
    assert truth.allocator_slack([2**20 + 1, 8]) == 512 + 2**20 + 512


def test_the_script_fails_when_the_caches_hold_other_than_was_observed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    truth = load()
    real = truth.storage_bytes
    monkeypatch.setattr(truth, "storage_bytes", lambda owner: (real(owner)[0] + 1, real(owner)[1]))
    monkeypatch.setattr(sys, "argv", ["gpu_truth.py", "--device", "cpu"])
    assert truth.main() == 1
    out = capsys.readouterr().out
    assert "FAIL codec-fp32: observed" in out and "FAIL codec-fp32: declared" in out
