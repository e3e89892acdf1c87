"""What the hook does inside a worker process, at each point of the worker's life.

- after ``init_device`` (the device, the CUDA context and the parallel groups are up; no model yet):
  measure what the process holds then, the runtime every later figure stands on;
- after ``load_model``: collect the model's declarations once, resolve them at
  ``max_num_seqs``, add the engine's identity and the weights' bytes, arrange to record the bytes
  of the CUDA graph pools when the runner captures them, start observing the declaring owners'
  caches, publish, start the heartbeat (which samples memory and observations; a diffusion
  worker, which has no later initialisation step, also takes its baseline; its sampler never
  resets torch's peak statistics, which vLLM-Omni resets and reads around every request);
- after ``initialize_from_config`` (a diffusion worker: ``set_kv_cache_configs``): add the
  paged KV cache, take the baseline;
- after ``compile_or_warm_up_model``: record the activation peak vLLM profiled and the graph pools;
  take the baseline again (initialisation is over), with the activation peak as the live tensors' headroom, and only from now on let the sampler
  reset torch's peak statistics (vLLM resets and reads them while it loads and profiles); a worker
  with vLLM 0.34's extensible KV cache is not initialised yet: its cache gets its final size next;
- after ``extend_kv_cache`` (vLLM 0.34, an extensible KV cache only): record the committed and the
  reserved cache, and take that baseline now, after the final commit;
- around ``determine_available_memory`` (vLLM's memory profile, which resets torch's peak and
  reads it; it runs again only when someone calls it after initialisation): hold the sampler's
  resets, so that the profile reads the whole peak;
- after ``sleep``, ``wake_up`` and vLLM 0.34's ``discard``: publish the sleep level and what vLLM's sleep
  allocator holds off the device, by tag (``sleep.py``);
- when the worker's step (``execute_model``, ``sample_tokens``) or its memory set-up (the profile, the KV cache's
  allocation, the warm-up, ``extend_kv_cache``) raises: end the snapshot with why (``out_of_memory`` or ``error``,
  ``engine.ending``) and the memory as the exception left it, before any of it is freed; the exception goes on
  unchanged, and nothing keeps it (its traceback holds the model's frames and their tensors);
- before ``shutdown`` (and at exit): mark the snapshot ended (``shutdown``; an engine that ended by an error stays
  ended as it did); before ``shutdown``, stop observing and
  discovering the worker's model (another model in the process keeps its own), even when the spool refuses the
  last write;
- a worker dropped without ``shutdown`` (an RL loop that makes and drops engines): the heartbeat notices at its next
  beat (it holds the worker weakly), ends the snapshot and stops observing and discovering that model.

Nothing of the hook holds the worker or its model strongly beyond the worker's own attributes: the heartbeat, the
discovery's paged-cache reader and the at-exit list hold it weakly or not at all, so both are freed after
``shutdown`` (or when the engine drops them).

``plugin`` runs every step guarded, so that no failure here reaches the engine.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from modelkv_exporter.contract.snapshot import MemorySample, SleepState, Snapshot
from modelkv_exporter.contract.spool import snapshot_file_name
from modelkv_exporter.engine.config import HookConfig
from modelkv_exporter.engine.discover import Discovery, discover
from modelkv_exporter.engine.engine_log import get_logger
from modelkv_exporter.engine.heartbeat import SnapshotPublisher, with_baseline
from modelkv_exporter.engine.observe import Observer, install
from modelkv_exporter.engine.protocol import declaring_owners
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_exporter.engine.samplers import MemorySampler, sampler_for
from modelkv_exporter.engine.vllm_hook.extensible_kv import (
    ExtensibleKV,
    WithExtensibleKV,
    committed_reader,
    extensible_cache,
    figures_of,
)
from modelkv_exporter.engine.vllm_hook.identity import claim_engine_id, engine_id_for, facts_of, requested_memory
from modelkv_exporter.engine.vllm_hook.memory_parts import (
    GraphPools,
    activation_peak_bytes,
    byte_count,
    eager,
    record_graph_capture,
    weights_bytes,
)
from modelkv_exporter.engine.vllm_hook.paged_kv import paged_kv_blocks, paged_kv_bytes, runner_caches
from modelkv_exporter.engine.vllm_hook.sleep import released_bytes, sleep_allocator

logger = get_logger("lifecycle")

ATTRIBUTE = "_modelkv_hook"
RUNTIME_ATTRIBUTE = "_modelkv_runtime"


@dataclass
class WorkerHook:
    """Per-worker state, kept on the worker object."""

    publisher: SnapshotPublisher
    sampler: MemorySampler
    observer: Observer | None = None
    discovery: Discovery | None = None

    def release(self) -> None:
        """Stop observing and discovering this worker's model; another model in the process keeps its own."""
        if self.discovery is not None:
            self.discovery.uninstall()
        if self.observer is not None:
            self.observer.uninstall()


@dataclass(frozen=True)
class Runtime:
    """What the process held before its model loaded, and the sampler that measured it (kept for the worker)."""

    sampler: MemorySampler
    runtime_bytes: int | None


def worker_sampler(worker: Any) -> MemorySampler:
    """The sampler of a worker's device, with its extensible KV cache's committed bytes where it has one."""
    return WithExtensibleKV(sampler_for(getattr(worker, "device", None)), committed_reader(worker))


def after_init_device(worker: Any, config: HookConfig) -> None:
    """The worker has its device and parallel groups and no model yet: measure the runtime the rest stands on."""
    sampler = worker_sampler(worker)
    setattr(worker, RUNTIME_ATTRIBUTE, Runtime(sampler, sampler().process_bytes))


def after_load_model(worker: Any, config: HookConfig) -> None:
    """Publish the declarations of the just-loaded model and start beating."""
    previous: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if previous is not None:
        _live.discard(previous.publisher)
        previous.publisher.stop()
        previous.release()
    facts = facts_of(worker)
    engine_id = claim_engine_id(engine_id_for(facts.identity, config.engine_id, facts.worker_rank), worker)
    runtime: Runtime | None = getattr(worker, RUNTIME_ATTRIBUTE, None)
    identity = {
        **facts.identity,
        "weights_bytes": weights_bytes(worker, facts.model),
        "runtime_bytes": None if runtime is None else runtime.runtime_bytes,
        "requested_memory_bytes": requested_memory(worker),
    }
    snapshot = build_snapshot(facts.model, max_num_seqs=facts.max_num_seqs, engine_id=engine_id, **identity)
    if callable(getattr(type(worker), "sleep", None)):
        snapshot = replace(snapshot, sleep=SleepState(level=0, released=released_bytes(sleep_allocator())))
    config.spool_dir.mkdir(parents=True, exist_ok=True)
    sampler = runtime.sampler if runtime is not None else worker_sampler(worker)
    observer = install(declaring_owners(facts.model), enabled=config.observe)
    declaring = {d.owner for d in snapshot.declarations} | {d.owner for d in snapshot.dropped_declarations or ()}
    discovery = discover(facts.model, config, observer, declaring)
    publisher = SnapshotPublisher(config.spool_dir, snapshot)
    publisher.start_heartbeat(config.sample_interval, sampler, observer.sample, discovery)
    hook = WorkerHook(publisher, sampler, observer, discovery)
    setattr(worker, ATTRIBUTE, hook)
    publisher.watch(worker, hook.release)
    record_graph_capture(worker, graph_recorder(worker), sampler.private_pools)
    _end_at_exit_later(publisher)
    if facts.settled_at_load:
        discovery.start()
        publisher.set_baseline(sampler())
    else:
        observations = observer.sample()
        publisher.beat(sampler(), observations, discovery.sample(observations))
    logger.info(
        "modelkv: %s publishes %d declaration(s) to %s (%d dropped)",
        engine_id,
        len(snapshot.declarations),
        publisher.spool_dir / snapshot_file_name(engine_id),
        snapshot.dropped_count or 0,
    )


_live: weakref.WeakSet[SnapshotPublisher] = weakref.WeakSet()
"""The publishers of this process's live workers, ended at exit; held weakly (each worker holds its own)."""
_exit_registration = threading.Lock()
_exit_registered = False


def _end_at_exit_later(publisher: SnapshotPublisher) -> None:
    """End ``publisher``'s snapshot at exit, unless it ended before (one ``atexit`` entry for the process)."""
    global _exit_registered
    with _exit_registration:
        _live.add(publisher)
        if not _exit_registered:
            atexit.register(_end_at_exit)
            _exit_registered = True


def _end_at_exit() -> None:
    for publisher in list(_live):
        try:
            publisher.end()
        except Exception as error:
            logger.warning("modelkv: cannot mark %s ended at exit: %s", publisher.spool_dir, str(error))


def after_kv_init(worker: Any, config: HookConfig, /, *args: Any, **kwargs: Any) -> None:
    """Record the paged KV cache (its backing allocation, counted once) and take the baseline.

    ``args`` and ``kwargs`` are the call's, as given. The ``KVCacheConfig`` is its ``kv_cache_config``
    (``initialize_from_config``'s one parameter, by keyword or first by position; vllm-ascend's worker
    does not copy its blocks to ``cache_config``) where that is one, else the runner's. An extensible
    KV cache (vLLM 0.34) has only reserved its capacity here: what it has committed is recorded apart.
    """
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if hook is None:
        return
    extensible = figures_of(extensible_cache(worker))
    if extensible is not None:
        record_extensible(hook, extensible, hook.sampler())
        return
    runner = getattr(worker, "model_runner", None)
    given = kwargs["kv_cache_config"] if "kv_cache_config" in kwargs else args[0] if args else None
    kv_config = given if hasattr(given, "kv_cache_tensors") else getattr(runner, "kv_cache_config", None)
    vllm_config = getattr(worker, "vllm_config", None)
    kv_bytes = paged_kv_bytes(kv_config, runner)
    kv_blocks = paged_kv_blocks(kv_config, getattr(vllm_config, "cache_config", None))
    sample = hook.sampler()

    def record(snapshot: Snapshot) -> Snapshot:
        settings = replace(snapshot.settings, paged_kv_blocks=kv_blocks, paged_kv_bytes=kv_bytes)
        return with_baseline(replace(snapshot, settings=settings), sample)

    hook.publisher.update(record)


def record_extensible(hook: WorkerHook, figures: ExtensibleKV, sample: MemorySample) -> None:
    """Publish an extensible KV cache's committed and reserved figures, with ``sample`` as the baseline."""

    def record(snapshot: Snapshot) -> Snapshot:
        settings = replace(
            snapshot.settings,
            paged_kv_bytes=figures.committed_bytes,
            paged_kv_blocks=figures.committed_blocks,
            paged_kv_reserved_bytes=figures.reserved_bytes,
            paged_kv_reserved_blocks=figures.reserved_blocks,
            torch_headroom_bytes=figures.torch_headroom_bytes,
        )
        return with_baseline(replace(snapshot, settings=settings), sample)

    hook.publisher.update(record)


def profiled_activation_peak(worker: Any) -> int | None:
    """The activation peak vLLM measured while profiling and planned for (``peak_activation_memory``), if known."""
    return byte_count(getattr(worker, "peak_activation_memory", None))


def after_warm_up(worker: Any, config: HookConfig) -> None:
    """Initialisation is over (graphs captured): this is the baseline growth is measured from.

    Not yet for a worker with an extensible KV cache: ``extend_kv_cache`` commits its final size
    next, outside torch, and the baseline follows that commit (``after_extend``).
    """
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if hook is not None:
        record_plan(hook, worker)
        if hook.discovery is not None:
            hook.discovery.start(paged_reader(worker))
        if figures_of(extensible_cache(worker)) is None:
            hook.publisher.set_baseline(hook.sampler.initialised(profiled_activation_peak(worker)))


def paged_reader(worker: Any) -> Callable[[], list[Any]]:
    """What reads the paged KV cache's tensors of the worker's runner now, holding the worker weakly (none once the
    worker is gone; strongly only a worker that cannot be held weakly)."""
    try:
        ref: Callable[[], Any] = weakref.ref(worker)
    except TypeError:
        ref = lambda: worker  # noqa: E731 - the same call as the weak reference's

    def read() -> list[Any]:
        return runner_caches(getattr(ref(), "model_runner", None))

    return read


def graph_recorder(worker: Any) -> Callable[[GraphPools], None]:
    """What records the worker's CUDA graph pools (their bytes, and their free blocks) into its current snapshot,
    holding the worker weakly."""
    ref = weakref.ref(worker)

    def record(pools: GraphPools) -> None:
        hook: WorkerHook | None = getattr(ref(), ATTRIBUTE, None)
        if hook is not None:
            hook.publisher.update(
                lambda snapshot: _with_settings(
                    snapshot, cuda_graph_bytes=pools.total, cuda_graph_free_bytes=pools.free
                )
            )

    return record


def _with_settings(snapshot: Snapshot, **changes: Any) -> Snapshot:
    return replace(snapshot, settings=replace(snapshot.settings, **changes))


def record_plan(hook: WorkerHook, worker: Any) -> None:
    """Publish the activation peak vLLM profiled, and 0 graph bytes for a worker that captures none."""
    activation = activation_peak_bytes(worker)
    captures_none = eager(worker) and hook.publisher.snapshot.settings.cuda_graph_bytes is None

    def record(snapshot: Snapshot) -> Snapshot:
        if not captures_none:
            return _with_settings(snapshot, activation_peak_bytes=activation)
        return _with_settings(snapshot, activation_peak_bytes=activation, cuda_graph_bytes=0, cuda_graph_free_bytes=0)

    hook.publisher.update(record)


def after_extend(worker: Any, config: HookConfig) -> None:
    """The extensible KV cache has its final size: record it, and take the baseline growth is measured from."""
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    figures = figures_of(extensible_cache(worker))
    if hook is not None and figures is not None:
        record_extensible(hook, figures, hook.sampler.initialised(profiled_activation_peak(worker)))


def hold_peak_resets(worker: Any, config: HookConfig) -> Callable[[], None] | None:
    """A step that measures torch's peak itself starts: hold the sampler's resets; the result releases them."""
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if hook is None:
        return None
    hold = getattr(hook.sampler, "hold_resets", None)
    return hold() if callable(hold) else None


def after_sleep(worker: Any, config: HookConfig, /, *args: Any, **kwargs: Any) -> None:
    """The worker slept at ``level`` (``sleep``'s one parameter, 1 by default): publish it, and what is off the device."""
    level = kwargs.get("level", args[0] if args else 1)
    publish_sleep(worker, level if isinstance(level, int) and level in (1, 2) else 1)


def after_wake_up(worker: Any, config: HookConfig, /, *args: Any, **kwargs: Any) -> None:
    """The worker mapped some or all of its memory again (``wake_up(tags)``): awake once nothing is off the device."""
    publish_sleep(worker, None)


def after_discard(worker: Any, config: HookConfig, /, *args: Any, **kwargs: Any) -> None:
    """vLLM 0.34 dropped tagged memory without a sleep (``discard(tags)``): publish what is off the device now."""
    publish_sleep(worker, None)


def publish_sleep(worker: Any, slept_at: int | None) -> None:
    """Publish the sleep level (``slept_at`` after a sleep; else the last one while anything is still off the device,
    0 once nothing is) and the bytes off the device by tag: the sleep allocator's books (None: they could not be
    read), and an extensible KV cache whose pages are released (it lives outside that allocator) under ``kv_cache``."""
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if hook is None:
        return
    released = released_bytes(sleep_allocator())
    extensible = figures_of(extensible_cache(worker))

    def record(snapshot: Snapshot) -> Snapshot:
        books = released
        if (
            books is not None
            and extensible is not None
            and extensible.committed_blocks
            and not extensible.committed_bytes
        ):
            books = {**books, "kv_cache": books.get("kv_cache", 0) + (snapshot.settings.paged_kv_bytes or 0)}
        before = snapshot.sleep.level if snapshot.sleep is not None else 0
        level = slept_at if slept_at is not None else before if books is None or books else 0
        return replace(snapshot, sleep=SleepState(level=level, released=books))

    hook.publisher.update(record)


def ended_by(worker: Any, config: HookConfig, error: BaseException) -> None:
    """``error`` is ending the worker's engine: write the snapshot's ending now, with why and the memory as the error
    left it (the error's frames still hold what they allocated). Keeps nothing of ``error`` but its type and first
    line; a later shutdown leaves this ending as it is."""
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if hook is None or hook.publisher.snapshot.ended:
        return
    _live.discard(hook.publisher)
    path = hook.publisher.died(error)
    end = hook.publisher.snapshot.end
    if end is not None:
        logger.warning("modelkv: %s ended (%s): %s", path, end.reason, end.error)


def before_shutdown(worker: Any, config: HookConfig) -> None:
    """Mark the snapshot ended so the sidecar stops exporting it, and stop observing and discovering the model, even
    when the spool refuses that last write (logged as text: the exception's traceback would hold the worker)."""
    hook: WorkerHook | None = getattr(worker, ATTRIBUTE, None)
    if hook is not None:
        _live.discard(hook.publisher)
        try:
            logger.info("modelkv: %s ended", hook.publisher.end())
        except OSError as error:
            logger.warning("modelkv: cannot mark %s ended: %s", hook.publisher.spool_dir, str(error))
        finally:
            hook.release()
