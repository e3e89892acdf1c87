"""Who a vLLM worker is: model, vLLM-Omni stage and replica, parallel ranks, device; and its engine id."""

from __future__ import annotations

import os
from typing import Any

from modelkv_exporter.engine.samplers import physical_device_id


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


def _rank(group: str) -> int | None:
    try:
        from vllm import distributed

        return int(getattr(distributed, f"get_{group}_group")().rank_in_group)
    except Exception:
        return None


def _first(value: Any) -> str | None:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return None if value is None else str(value)


def _as_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else None


def identity_of(worker: Any) -> dict[str, Any]:
    """The engine's identity and settings as ``build_snapshot`` keyword arguments."""
    config = worker.vllm_config
    model_config = config.model_config
    stage_id = getattr(model_config, "stage_id", None)
    stage_name = getattr(model_config, "model_stage", None)
    device = getattr(worker, "device", None)
    on_cuda = getattr(device, "type", None) == "cuda"
    architecture = _first(getattr(model_config, "architectures", None)) or _first(
        getattr(getattr(model_config, "hf_config", None), "architectures", None)
    )
    identity: dict[str, Any] = {
        "model": _first(getattr(model_config, "model", None)),
        "served_model_name": _first(getattr(model_config, "served_model_name", None)),
        "architecture": architecture,
        "stage_id": _as_int(stage_id),
        "stage_name": None if stage_name is None else str(stage_name),
        "replica": os.environ.get("VLLM_OMNI_REPLICA_ID"),
        "tp_rank": _rank("tp"),
        "pp_rank": _rank("pp"),
        "dp_rank": getattr(config.parallel_config, "data_parallel_rank", None),
        "local_device": getattr(worker, "local_rank", None),
        "device": str(physical_device_id(device)) if on_cuda else str(getattr(device, "type", "cpu")),
    }
    if on_cuda:
        identity["gpu_memory_utilization"] = getattr(config.cache_config, "gpu_memory_utilization", None)
    return identity


def engine_id_for(identity: dict[str, Any], prefix: str | None) -> str:
    """A stable id per worker, so a restarted engine replaces its own snapshot."""
    parts = [prefix or identity.get("served_model_name") or "engine"]
    if identity.get("stage_id") is not None:
        parts.append(f"s{identity['stage_id']}")
    if identity.get("replica"):
        parts.append(f"r{identity['replica']}")
    for key in ("dp", "tp", "pp"):
        rank = identity.get(f"{key}_rank")
        if rank is not None:
            parts.append(f"{key}{rank}")
    return "-".join(str(p) for p in parts)[:256]
