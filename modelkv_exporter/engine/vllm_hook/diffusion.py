"""Who a vLLM-Omni diffusion worker is, and what its stage runs with.

vLLM-Omni's ``DiffusionWorker`` is not a vLLM worker: its settings are an
``OmniDiffusionConfig`` (``worker.od_config``), its model is the pipeline its runner loaded
(``worker.model_runner.pipeline``), and its ``vllm_config`` is one vLLM-Omni builds for the
runner, whose ``scheduler_config.max_num_seqs`` is not the stage's (vLLM's default in the
dense mode, rows rather than requests in the paged one).

- stage id: ``od_config.stage_id``; stage name: ``od_config.model_stage`` where a vLLM-Omni
  version has it (0.30 keeps the name in the orchestrator only, so the stage label is the id);
- replica: ``VLLM_OMNI_REPLICA_ID`` when set, else the ``omni_replica_id`` vLLM-Omni started
  this ``StageDiffusionProc`` process with (0.30 sets the variable for its AR stages only);
- max_num_seqs: ``od_config.max_num_seqs``, the requests the stage's diffusion scheduler runs
  at once; absent when the config has no positive integer there;
- ``gpu_memory_utilization`` only in the paged KV mode, the one mode that sizes by it;
- a stage on more than one GPU runs one worker per GPU, told apart by their rank (``w<rank>``).
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from modelkv_exporter.engine.samplers import physical_device_id
from modelkv_exporter.engine.vllm_hook.facts import WorkerFacts, as_int, first, rank_of

STAGE_PROCESS = "StageDiffusionProc"


def stage_process_replica() -> str | None:
    """The replica id this process was started with, if it is vLLM-Omni's diffusion stage process."""
    process = multiprocessing.current_process()
    if process.name != STAGE_PROCESS:
        return None
    replica = as_int(getattr(process, "_kwargs", {}).get("omni_replica_id"))
    return None if replica is None else str(max(replica, 0))


def _positive(value: Any) -> int | None:
    number = as_int(value)
    return number if number is not None and number > 0 else None


def diffusion_facts(worker: Any) -> WorkerFacts:
    """The facts of a ``DiffusionWorker`` after ``load_model``."""
    od_config = worker.od_config
    device = getattr(worker, "device", None)
    on_cuda = getattr(device, "type", None) == "cuda"
    model = first(getattr(od_config, "model", None))
    stage_name = getattr(od_config, "model_stage", None)
    num_gpus = _positive(getattr(od_config, "num_gpus", None)) or 1
    identity: dict[str, Any] = {
        "model": model,
        "served_model_name": first(getattr(od_config, "served_model_name", None)),
        "architecture": first(getattr(od_config, "model_class_name", None))
        or type(getattr(worker.model_runner, "pipeline", None)).__name__,
        "stage_id": as_int(getattr(od_config, "stage_id", None)),
        "stage_name": None if stage_name is None else str(stage_name),
        "replica": os.environ.get("VLLM_OMNI_REPLICA_ID") or stage_process_replica(),
        "tp_rank": rank_of("tp"),
        "pp_rank": rank_of("pp"),
        "local_device": as_int(getattr(worker, "local_rank", None)),
        "device": str(physical_device_id(device)) if on_cuda else str(getattr(device, "type", "cpu")),
    }
    if on_cuda and getattr(getattr(od_config, "diffusion_kv_mode", None), "name", None) == "PAGED_SCHEDULER":
        identity["gpu_memory_utilization"] = getattr(od_config, "gpu_memory_utilization", None)
    return WorkerFacts(
        identity=identity,
        max_num_seqs=_positive(getattr(od_config, "max_num_seqs", None)),
        model=worker.model_runner.pipeline,
        settled_at_load=True,
        worker_rank=as_int(getattr(worker, "rank", None)) if num_gpus > 1 else None,
    )
