"""What the hook does inside a worker process, at each point of the worker's life.

- after ``load_model``: collect the model's declarations once, resolve them at
  ``max_num_seqs``, add the engine's identity, publish, start the heartbeat;
- after ``initialize_from_config``: add the paged KV cache, take the baseline;
- after ``compile_or_warm_up_model``: take the baseline again (initialisation is over), with the
  activation peak vLLM profiled as the live tensors' headroom, and only from now on let the sampler
  reset torch's peak statistics (vLLM resets and reads them while it loads and profiles);
- before ``shutdown`` (and at exit): mark the snapshot ended.

``plugin`` runs every step guarded, so that no failure here reaches the engine.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass, replace
from typing import Any

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.spool import snapshot_file_name
from modelkv_exporter.engine.heartbeat import SnapshotPublisher, with_baseline
from modelkv_exporter.engine.log import get_logger
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_exporter.engine.samplers import MemorySampler, sampler_for
from modelkv_exporter.engine.vllm_hook.config import HookConfig
from modelkv_exporter.engine.vllm_hook.identity import engine_id_for, identity_of, model_of

logger = get_logger("lifecycle")

ATTRIBUTE = "_modelkv_hook"


@dataclass
class WorkerHook:
    """Per-worker state, kept on the worker object."""

    publisher: SnapshotPublisher
    sampler: MemorySampler


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
        "modelkv: %s publishes %d declaration(s) to %s (%d dropped)",
        engine_id,
        len(snapshot.declarations),
        publisher.spool_dir / snapshot_file_name(engine_id),
        snapshot.dropped_count or 0,
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


def activation_budget(worker: Any) -> int | None:
    """The activation peak vLLM measured while profiling and budgeted for (``peak_activation_memory``), if known."""
    value = getattr(worker, "peak_activation_memory", None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


def after_warm_up(worker: Any, config: HookConfig) -> None:
    """Initialisation is over (graphs captured): this is the baseline growth is measured from."""
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if hook is not None:
        hook.publisher.set_baseline(hook.sampler.initialised(activation_budget(worker)))


def before_shutdown(worker: Any, config: HookConfig) -> None:
    """Mark the snapshot ended so the sidecar stops exporting it."""
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if hook is not None:
        hook.publisher.end()
