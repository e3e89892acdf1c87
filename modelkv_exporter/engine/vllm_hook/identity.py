"""Who a vLLM worker is: model, vLLM-Omni stage and replica, parallel ranks, device; and its engine id.

``facts_of`` answers for both kinds of worker the hook patches: vLLM's (any platform's class
that vLLM's worker wrapper builds) and vLLM-Omni's ``DiffusionWorker`` (``diffusion.py``).
"""

from __future__ import annotations

import os
from typing import Any

from modelkv_exporter.engine.samplers import physical_device_id
from modelkv_exporter.engine.vllm_hook.diffusion import diffusion_facts
from modelkv_exporter.engine.vllm_hook.facts import WorkerFacts, as_int, first, rank_of


def facts_of(worker: Any) -> WorkerFacts:
    """The facts of a vLLM worker, or of a vLLM-Omni diffusion worker (it has an ``od_config``)."""
    if getattr(worker, "od_config", None) is not None:
        return diffusion_facts(worker)
    max_num_seqs = as_int(getattr(worker.vllm_config.scheduler_config, "max_num_seqs", None))
    return WorkerFacts(identity_of(worker), max_num_seqs if max_num_seqs else None, model_of(worker))


def model_of(worker: Any) -> Any:
    """The loaded model of a worker's runner (``get_model()`` where the runner has it)."""
    runner = worker.model_runner
    get_model = getattr(runner, "get_model", None)
    if callable(get_model):
        try:
            return get_model()
        except Exception:
            pass
    return runner.model


def identity_of(worker: Any) -> dict[str, Any]:
    """The engine's identity and settings as ``build_snapshot`` keyword arguments."""
    config = worker.vllm_config
    model_config = config.model_config
    stage_id = getattr(model_config, "stage_id", None)
    stage_name = getattr(model_config, "model_stage", None)
    device = getattr(worker, "device", None)
    on_cuda = getattr(device, "type", None) == "cuda"
    architecture = first(getattr(model_config, "architectures", None)) or first(
        getattr(getattr(model_config, "hf_config", None), "architectures", None)
    )
    identity: dict[str, Any] = {
        "model": first(getattr(model_config, "model", None)),
        "served_model_name": first(getattr(model_config, "served_model_name", None)),
        "architecture": architecture,
        "stage_id": as_int(stage_id),
        "stage_name": None if stage_name is None else str(stage_name),
        "replica": os.environ.get("VLLM_OMNI_REPLICA_ID"),
        "tp_rank": rank_of("tp"),
        "pp_rank": rank_of("pp"),
        "dp_rank": getattr(config.parallel_config, "data_parallel_rank", None),
        "local_device": getattr(worker, "local_rank", None),
        "device": str(physical_device_id(device)) if on_cuda else str(getattr(device, "type", "cpu")),
    }
    if on_cuda:
        identity["gpu_memory_utilization"] = getattr(config.cache_config, "gpu_memory_utilization", None)
    return identity


def engine_id_for(identity: dict[str, Any], prefix: str | None, worker_rank: int | None = None) -> str:
    """A stable id per worker, so a restarted engine replaces its own snapshot.

    Named for the served model, else the model's last path part (vLLM always has the former).
    """
    model = str(identity.get("model") or "").rstrip("/").rsplit("/", 1)[-1]
    parts = [prefix or identity.get("served_model_name") or model or "engine"]
    if identity.get("stage_id") is not None:
        parts.append(f"s{identity['stage_id']}")
    if identity.get("replica"):
        parts.append(f"r{identity['replica']}")
    for key in ("dp", "tp", "pp"):
        rank = identity.get(f"{key}_rank")
        if rank is not None:
            parts.append(f"{key}{rank}")
    if worker_rank is not None:
        parts.append(f"w{worker_rank}")
    return "-".join(str(p) for p in parts)[:256]
