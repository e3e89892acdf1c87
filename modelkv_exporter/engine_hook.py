"""What the vLLM plugin does inside a worker process, at each point of the worker's life.

- after ``load_model``: collect the model's declarations once, resolve them at
  ``max_num_seqs``, add the engine's identity, publish, start the heartbeat;
- after ``initialize_from_config``: add the paged KV cache, take the baseline;
- after ``compile_or_warm_up_model``: take the baseline again (initialisation is over);
- before ``shutdown`` (and at exit): mark the snapshot ended.

Every step is wrapped by the plugin so that no failure here reaches the engine.
"""

from __future__ import annotations

import atexit
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from modelkv_exporter.engine_memory import Sampler, physical_device_id, sampler_for
from modelkv_exporter.publisher import SnapshotPublisher, with_baseline
from modelkv_exporter.publishing import build_snapshot
from modelkv_exporter.settings import DEFAULT_SAMPLE_INTERVAL, sample_interval
from modelkv_exporter.snapshot import Snapshot
from modelkv_exporter.spool import snapshot_file_name

logger = logging.getLogger("vllm.modelkv_exporter")
"""Under vLLM's logger tree, so these lines follow vLLM's format and VLLM_LOGGING_LEVEL."""

ATTRIBUTE = "_modelkv_hook"


@dataclass
class HookConfig:
    """The engine-side settings, read from the environment."""

    spool_dir: Path
    sample_interval: float = DEFAULT_SAMPLE_INTERVAL
    engine_id_prefix: str | None = None

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> HookConfig | None:
        """None when ``MODELKV_SPOOL_DIR`` is unset (the plugin then stays inactive)."""
        env = os.environ if environ is None else environ
        spool = env.get("MODELKV_SPOOL_DIR", "").strip()
        if not spool:
            return None
        interval = DEFAULT_SAMPLE_INTERVAL
        raw = env.get("MODELKV_SAMPLE_INTERVAL")
        if raw:
            try:
                interval = sample_interval(raw)
            except ValueError:
                logger.warning("modelkv: MODELKV_SAMPLE_INTERVAL=%r is not a number; using %s", raw, interval)
        return cls(Path(spool), interval, env.get("MODELKV_ENGINE_ID") or None)


@dataclass
class WorkerHook:
    """Per-worker state, kept on the worker object."""

    publisher: SnapshotPublisher
    sampler: Sampler


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


def after_load_model(worker: Any, config: HookConfig) -> None:
    """Publish the declarations of the just-loaded model and start beating."""
    previous: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if previous is not None:
        previous.publisher.stop()
    identity = identity_of(worker)
    max_num_seqs = int(worker.vllm_config.scheduler_config.max_num_seqs)
    engine_id = engine_id_for(identity, config.engine_id_prefix)
    snapshot = build_snapshot(model_of(worker), max_num_seqs=max_num_seqs, engine_id=engine_id, **identity)
    config.spool_dir.mkdir(parents=True, exist_ok=True)
    sampler = sampler_for(getattr(worker, "device", None))
    publisher = SnapshotPublisher(config.spool_dir, snapshot)
    publisher.start_heartbeat(config.sample_interval, sampler)
    setattr(worker, ATTRIBUTE, WorkerHook(publisher, sampler))
    atexit.register(_end_at_exit, publisher)
    publisher.beat(sampler())
    logger.info(
        "modelkv: %s publishes %d declaration(s) to %s",
        engine_id,
        len(snapshot.declarations),
        publisher.spool_dir / snapshot_file_name(engine_id),
    )


def _end_at_exit(publisher: SnapshotPublisher) -> None:
    try:
        publisher.end()
    except Exception as error:
        logger.warning("modelkv: cannot mark %s ended at exit: %s", publisher.spool_dir, error)


def after_kv_init(worker: Any, config: HookConfig) -> None:
    """Record the paged KV cache and take the baseline."""
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if hook is None:
        return
    blocks = getattr(worker.cache_config, "num_gpu_blocks", None)
    tensors = getattr(getattr(worker.model_runner, "kv_cache_config", None), "kv_cache_tensors", None)
    kv_bytes = sum(int(t.size) for t in tensors) if tensors else None
    kv_blocks = None if blocks is None else int(blocks)
    sample = hook.sampler()

    def record(snapshot: Snapshot) -> Snapshot:
        settings = replace(snapshot.settings, paged_kv_blocks=kv_blocks, paged_kv_bytes=kv_bytes)
        return with_baseline(replace(snapshot, settings=settings), sample)

    hook.publisher.update(record)


def after_warm_up(worker: Any, config: HookConfig) -> None:
    """Initialisation is over (graphs captured): this is the baseline growth is measured from."""
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if hook is not None:
        hook.publisher.set_baseline(hook.sampler())


def before_shutdown(worker: Any, config: HookConfig) -> None:
    """Mark the snapshot ended so the sidecar stops exporting it."""
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if hook is not None:
        hook.publisher.end()
