"""The worker-wrapper hook on a platform's worker that is no subclass of vLLM's ``Worker``.

vLLM's real ``WorkerWrapperBase.init_worker`` builds the test platform's worker (a
``WorkerBase``, as vllm-ascend's ``NPUWorker`` is) in a process that imported
``worker_base`` first, as vLLM's worker processes do. ``init_worker`` loads the plugins
itself, so ``register()`` runs inside the call that builds the worker: the hook must notice.
With that noticing switched off, the worker goes unhooked and nothing is published, which
shows the test watches the mechanism.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelkv_exporter.sidecar.reader.decode import parse_snapshot
from modelkv_testbed import ROOT
from modelkv_testbed.tiny_model import make_tiny_qwen2

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "engine" / "fixtures" / "platform_worker_run.py"
PLUGIN_PATH = ROOT / "tests" / "engine" / "fixtures" / "plugin_pkg"
LIFECYCLE = ["load_model", "initialize_from_config", "compile_or_warm_up_model", "shutdown"]
KV_BYTES = 16 * 4096  # BLOCKS x PAGE in the script: one buffer under two KV-cache groups


def run_script(*argv: str, spool: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELKV_")}
    env.update(
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([str(PLUGIN_PATH), str(ROOT)]),
        VLLM_PLUGINS="modelkv_exporter,modelkv_test_models",
    )
    if spool is not None:
        env["MODELKV_SPOOL_DIR"] = str(spool)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("platform")
    model = make_tiny_qwen2(directory / "model")
    run_script("config", str(model), str(directory / "config.pkl"))
    return directory / "config.pkl"


def line(output: str, prefix: str) -> object:
    (found,) = [text for text in output.splitlines() if text.startswith(prefix + " ")]
    return json.loads(found.removeprefix(prefix + " "))


@pytest.mark.parametrize("how", ["in-flight", "registered-first"])
def test_a_worker_that_is_no_vllm_worker_is_hooked_through_the_wrapper(config: Path, tmp_path: Path, how: str) -> None:
    output = run_script("run", str(config), how, spool=tmp_path)
    mro = line(output, "MRO")
    assert "vllm.v1.worker.gpu_worker.Worker" not in mro and "vllm.v1.worker.worker_base.WorkerBase" in mro
    assert line(output, "CALLS") == LIFECYCLE, "each original ran exactly once"
    assert line(output, "HOOKED") is True
    (path,) = tmp_path.glob("*.json")
    snapshot = parse_snapshot(path.read_bytes())
    assert [d.name for d in snapshot.declarations] == ["test_static_cache"]
    assert snapshot.settings.max_num_seqs == 4 and snapshot.declarations[0].row_count == 4
    assert snapshot.settings.paged_kv_bytes == KV_BYTES, "two groups over one buffer: its bytes once"
    assert snapshot.settings.paged_kv_blocks == 16, "from the KVCacheConfig; this worker leaves cache_config alone"
    assert snapshot.measured.baseline is not None and snapshot.ended


def test_without_noticing_the_running_init_worker_the_worker_goes_unhooked(config: Path, tmp_path: Path) -> None:
    output = run_script("run", str(config), "in-flight-broken", spool=tmp_path)
    assert line(output, "CALLS") == LIFECYCLE
    assert line(output, "HOOKED") is False
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
