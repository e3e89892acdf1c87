"""vLLM-Omni's real ``DiffusionWorker`` in a real diffusion stage on CPU, through the hook, the spool and /metrics.

vLLM-Omni's own ``StageDiffusionProcManager`` starts the stage process; in it vLLM-Omni loads
the plugins, builds its ``DiffusionEngine`` and uniproc executor, and the ``DiffusionWorker``
sets up its device and process group, loads a tiny custom pipeline whose module tree holds a
declaring cache owner, and serves the engine's warm-up request. Two things stand in for what
this machine lacks, both test-only: a CPU platform registered through vLLM-Omni's platform
plugins (vLLM-Omni has none for CPU), and a torchvision stand-in that serves the names the
import chain asks for (PyPI's torchvision does not load beside the CPU torch).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelkv_testbed import ROOT
from modelkv_testbed.polling import eventually
from modelkv_testbed.processes import start_sidecar, stop_process
from tests.engine.test_vllm_engine import Engine, metrics, only

pytestmark = pytest.mark.slow

OMNI_SITE = ROOT / "tests" / "engine" / "fixtures" / "omni_site"
ROW_BYTES = 2 * 2 * 2 * 64 * 64 * 4  # K and V x 2 layers x 2 kv heads x head_dim 64 x 64 positions x float32
STAGE_MAX_NUM_SEQS = 3  # od_config.max_num_seqs; the runner's own vllm_config says 128


def test_a_diffusion_stage_publishes_identity_memory_heartbeat_and_its_pipelines_declarations(
    tmp_path: Path, spool: Path
) -> None:
    model = tmp_path / "tiny-diffusion"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["TinyDiffusionPipeline"], "model_type": "tiny"}))
    sidecar = start_sidecar(spool, "--stale-after", "2")
    stage = Engine(
        model,
        spool,
        script="run_diffusion_stage.py",
        arguments=(),
        env={"MODELKV_TEST_OMNI_CPU": "1", "MODELKV_TEST_TORCHVISION_STANDIN": "1"},
        path=(OMNI_SITE,),
    )
    try:
        stage.wait_for("READY")
        assert "OmniPlatform plugin modelkv_test_cpu is activated" in stage.output()
        m = metrics(sidecar)
        info, _ = only(m["modelkv_engine_info"])
        assert info == {
            "engine": "tiny-diffusion-s2-r1-tp0-pp0",
            "model": str(model),
            "stage": "2",
            "architecture": "TinyDiffusionPipeline",
            "replica": "1",
            "ranks": "tp0-pp0",
            "device": "cpu",
            "writer": info["writer"],
        }
        labels, peak = only(m["modelkv_declared_peak_bytes"])
        assert (labels["owner"], labels["cache"], labels["rows"]) == (
            "text_encoder.kv_owner",
            "test_static_cache",
            "max_num_seqs",
        )
        assert peak == ROW_BYTES * STAGE_MAX_NUM_SEQS
        assert only(m["modelkv_engine_max_num_seqs"])[1] == STAGE_MAX_NUM_SEQS
        assert "modelkv_engine_paged_kv_bytes" not in m, "the dense diffusion mode has no paged KV cache"
        assert only(m["modelkv_memory_process_resident_bytes"])[1] > 100 * 2**20
        assert only(m["modelkv_memory_process_resident_baseline_bytes"])[1] > 100 * 2**20
        assert only(m["modelkv_engine_up"])[1] == 1

        before = sidecar.get("/api/v1/engines").json()["engines"][0]["snapshot"]["heartbeat_at"]
        eventually(
            lambda: sidecar.get("/api/v1/engines").json()["engines"][0]["snapshot"]["heartbeat_at"] > before,
            "a heartbeat",
            timeout=10,
        )
        stage.stop()
        ended_by_shutdown = f"modelkv: {spool / 'tiny-diffusion-s2-r1-tp0-pp0.json'} ended"
        assert ended_by_shutdown in stage.output(), "marked ended by the worker's shutdown, not only at exit"
        m = metrics(sidecar)
        assert "modelkv_engine_up" not in m
        assert [v for labels, v in m["modelkv_exporter_spool_files"] if labels["state"] == "ended"] == [1]
    finally:
        stage.kill_all()
        stop_process(sidecar.process)
