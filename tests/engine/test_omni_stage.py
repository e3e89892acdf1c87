"""A real vLLM-Omni LLM stage replica on vLLM's CPU worker: its stage identity, read through /metrics.

vLLM-Omni's ``OmniEngineArgs`` make the ``OmniModelConfig`` (stage id 1, ``model_stage``
"talker"); vLLM-Omni's ``launch_stage_replica`` starts its ``StageEngineCoreProc`` as replica 3,
which sets ``VLLM_OMNI_REPLICA_ID`` for its worker; the model is the test architecture,
registered in vLLM-Omni's own model registry. The stage modules need the torchvision stand-in.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modelkv_testbed import ROOT
from modelkv_testbed.processes import start_sidecar, stop_process
from modelkv_testbed.tiny_model import make_tiny_qwen2
from tests.engine.test_vllm_engine import MAX_NUM_SEQS, ROW_BYTES, Engine, metrics, only

pytestmark = pytest.mark.slow

OMNI_SITE = ROOT / "tests" / "engine" / "fixtures" / "omni_site"
ENGINE_ID = "tiny-omni-s1-r3-dp0-tp0-pp0"


def test_an_omni_stage_replica_publishes_its_stage_name_id_and_replica(tmp_path: Path, spool: Path) -> None:
    model = make_tiny_qwen2(tmp_path / "model", "ModelKVTestForCausalLM")
    sidecar = start_sidecar(spool)
    stage = Engine(
        model,
        spool,
        script="run_omni_stage.py",
        env={"MODELKV_TEST_OMNI_REGISTRY": "1", "MODELKV_TEST_TORCHVISION_STANDIN": "1", "VLLM_OMNI_REPLICA_ID": ""},
        path=(OMNI_SITE,),
    )
    try:
        assert stage.wait_for("MODEL_CONFIG").split() == ["MODEL_CONFIG", "OmniModelConfig"]
        stage.wait_for("READY")
        m = metrics(sidecar)
        info, _ = only(m["modelkv_engine_info"])
        assert (info["engine"], info["stage"], info["replica"], info["ranks"], info["device"]) == (
            ENGINE_ID,
            "talker",
            "3",
            "tp0-pp0-dp0",
            "cpu",
        )
        assert info["architecture"] == "ModelKVTestForCausalLM"
        labels, peak = only(m["modelkv_declared_peak_bytes"])
        assert (labels["engine"], labels["stage"], labels["cache"]) == (ENGINE_ID, "talker", "test_static_cache")
        assert peak == ROW_BYTES * MAX_NUM_SEQS
        assert only(m["modelkv_engine_paged_kv_bytes"])[1] == 1024**3
        snapshot = sidecar.get("/api/v1/engines").json()["engines"][0]["snapshot"]
        assert (snapshot["engine"]["stage_id"], snapshot["engine"]["stage_name"]) == (1, "talker")
        stage.stop()
        assert f"modelkv: {spool / (ENGINE_ID + '.json')} ended" in stage.output()
    finally:
        stage.kill_all()
        stop_process(sidecar.process)
