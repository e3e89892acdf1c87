"""Engines and devices minute by minute: what each engine process holds, and what each device has in use.

A GPU engine's live tensors are its runtime buffers, its weights, its paged KV cache, what its
model-local caches hold, what undeclared owners hold and what leaks: the floor they stand at between
engine steps. Each sample window adds a transient activation peak on top; a busy engine's samples may
all land inside steps (``Engine.busy``: the least activations any sample of the minute saw), so the
live tensors at a sample and the lowest of a window's samples (``torch_allocated_low_water``, the
floor as the hook reads it, over two minutes as the hook keeps it) stand that much above the floor; torch's caching allocator keeps the highest window peak since
start (or since vLLM last emptied it), so ``torch_reserved`` only grows between those points. The
CUDA graph pools captured in the last loading minute are torch's too: private-pool segments whose
blocks are free between replays. NVML's figure for the process is the allocator's memory plus the
CUDA context and whatever the process allocated outside torch, less what vLLM's sleep allocator
holds off the device while the engine sleeps (torch's figures do not move then). A device's used
memory is the sum over every process on it, hung ones included, plus processes that publish no
snapshot (a trainer, another tenant). A CPU engine's resident memory keeps the most its caches ever
held (the C allocator rarely returns freed heap) plus its own heap growth.

A vLLM 0.34 engine with an extensible KV cache (``ExtensibleKV``) keeps its paged KV cache outside
torch: pages mapped by the driver, in NVML's figure and the device's but in no torch figure, and
committed in steps (reserve, warm-up, the final extend, released while asleep).

Each sample also says what the hook has recorded by then (``Sample.recorded``: the settings the
memory breakdown splits the process figure with) and, once the engine is ready, what the physics
knows each part of the breakdown holds (``Sample.truth``), the memory no part names included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

GIB = 1024**3
MIB = 1024**2
STALE_AFTER_S = 30
"""The sidecar's default ``--stale-after``."""
FORGET_AFTER_S = 3600
"""The sidecar's default ``--forget-after``."""
DISCOVERY_FLOOR = 16 * MIB
"""The engines' size floor: discovered owners below it are counted, not published."""
HOST_RUNTIME = GIB
"""What a CPU engine's resident base holds besides its weights: the interpreter, torch, libraries."""

Curve = Callable[[int], int]
"""Bytes at a story minute."""
Discovered = dict[tuple[str, str], tuple[int, int]]
"""Per (undeclared owner, found_by): bytes in the last window and most bytes since start."""


def flat(value: int = 0) -> Curve:
    """The same bytes at every minute."""
    return lambda t: value


def step(at: int, by: int) -> Curve:
    """0 before minute ``at``, ``by`` from then on."""
    return lambda t: by if t >= at else 0


def ramp(start: int, per_minute: int, stop: int | None = None) -> Curve:
    """Growing by ``per_minute`` from minute ``start`` (until ``stop``, then flat)."""
    end = stop if stop is not None else 10**9
    return lambda t: per_minute * (min(t, end) - start) if t > start else 0


def burst(start: int, stop: int, value: int, after: int = 0) -> Curve:
    """``value`` from ``start`` until ``stop``, ``after`` from then on, 0 before."""
    return lambda t: 0 if t < start else value if t < stop else after


def bursts(first: int, every: int, length: int, value: int) -> Curve:
    """``value`` for ``length`` minutes every ``every`` minutes from minute ``first``, 0 between."""
    return lambda t: value if t >= first and (t - first) % every < length else 0


def plus(*curves: Curve) -> Curve:
    """The sum of curves."""
    return lambda t: sum(c(t) for c in curves)


@dataclass(frozen=True)
class Device:
    """One GPU; ``others`` is memory held by processes that publish no snapshot: bytes, or bytes at each minute."""

    uuid: str
    total: int = 80 * GIB
    others: int | Curve = 0

    def others_at(self, t: int) -> int:
        """Bytes the processes that publish no snapshot hold at minute ``t``."""
        return self.others(t) if callable(self.others) else self.others


@dataclass(frozen=True)
class Cache:
    """One declared model-local KV cache and the bytes its owner's caches hold in each sample window."""

    owner: str
    name: str
    row_bytes: int
    held: Curve = flat()
    fixed_rows: int | None = None
    """None: one row per sequence (``max_num_seqs``)."""


@dataclass(frozen=True)
class Undeclared:
    """A cache that an owner keeps without declaring it, as discovery finds it."""

    owner: str
    held: Curve
    found_by: str = "cache_layer"
    """Two methods that find one owner see views of the same memory: the owner holds the larger figure."""


NULL_BLOCK = 2 * MIB
"""What an extensible KV cache commits when it is created, and keeps through warm-up's releases: one granule."""


@dataclass(frozen=True)
class ExtensibleKV:
    """vLLM 0.34's extensible KV cache, minute by minute of an engine's start-up (``load_minutes`` long).

    Four minutes before the engine is ready, ``initialize_from_config`` reserves ``reserved`` bytes of
    address space and commits the null block; warm-up then commits ``warm_up`` bytes for two minutes
    and, when it captures CUDA graphs, gives them back before capture; an ``eager`` engine (no graphs)
    keeps them until the final ``extend_kv_cache``. That final commit (or shrink) to the engine's
    ``paged_kv`` lands when the engine is ready. While the engine sleeps its pages are released, and
    recommitted when it wakes.
    """

    reserved: int = 120 * GIB
    warm_up: int = 8 * GIB
    eager: bool = False
    baseline_at_warm_up: bool = False
    """The hook before vLLM 0.34 support: its baseline at the end of warm-up, before the final commit."""

    def committed(self, since: int, load_minutes: int, final: int, asleep: bool) -> int:
        """Bytes mapped ``since`` minutes after the process started."""
        if since < load_minutes - 4:
            return 0
        if since == load_minutes - 4:
            return NULL_BLOCK
        if since < load_minutes - 1:
            return NULL_BLOCK + self.warm_up
        if since < load_minutes:
            return NULL_BLOCK + self.warm_up if self.eager else NULL_BLOCK
        return 0 if asleep else final


WEIGHTS_TAG, KV_CACHE_TAG, CUDAGRAPH_TAG, RUNTIME_TAG = "weights", "kv_cache", "cudagraph", "runtime"
SLEEP_TAGS_030 = (WEIGHTS_TAG, KV_CACHE_TAG)
"""What vLLM 0.30 to 0.33 allocate through the sleep allocator (``CuMemAllocator``) in sleep mode."""
SLEEP_TAGS_034 = (WEIGHTS_TAG, KV_CACHE_TAG, CUDAGRAPH_TAG, RUNTIME_TAG)
"""vLLM 0.34: also the CUDA graph pools and the runner's buffers."""


@dataclass(frozen=True)
class Sleep:
    """One sleep of vLLM's sleep mode, from story minute ``start`` to ``stop`` (not included), at ``level``.

    The sleep allocator unmaps what it holds: NVML's figure drops by it and torch's do not move (its
    pool's segments stay reserved, its tensors allocated). Level 1 backs the weights up in host memory
    first (the process's resident memory grows by them), level 2 discards them. An extensible KV
    cache releases its pages beside it.
    """

    start: int
    stop: int
    level: int = 1

    def covers(self, t: int) -> bool:
        """Whether the engine sleeps at minute ``t``."""
        return self.start <= t < self.stop


@dataclass(frozen=True)
class Engine:
    """One engine process (and the one that replaces it after a restart), as its hook measures it."""

    engine_id: str
    pod: str
    instance: str
    device: Device | None
    """None: a CPU engine, measured by resident memory."""
    model: str = "omni"
    stage: str = "talker"
    architecture: str = "Qwen3OmniMoeForConditionalGeneration"
    started: int = -600
    """Story minute the engine process started publishing (negative: long before the story)."""
    load_minutes: int = 10
    weights: int = 16 * GIB
    paged_kv: int = 30 * GIB
    context: int = GIB
    """The CUDA context and what the process holds outside torch before its model loads."""
    runtime_buffers: int = 0
    """Tensors the runner makes before the model loads (vLLM 0.34's persistent buffers): the runtime's, in torch."""
    graphs: int = 0
    """Bytes of the CUDA graph pools captured in the last loading minute (0: ``enforce_eager``)."""
    profiled_activation_peak: int = 2 * GIB
    """The activation peak vLLM profiled and planned for (``activation_peak_bytes``; vLLM 0.34 keeps as much free for
    torch beside an extensible KV cache)."""
    activation: Curve = flat()
    busy: Curve = flat()
    """The least activations any sample of the minute saw (0: a sample fell between two steps); at most ``activation``."""
    floor: bool = True
    """Whether the hook reports the floor of live tensors (``torch_allocated_low_water``); an older one does not."""
    caches: tuple[Cache, ...] = ()
    undeclared: tuple[Undeclared, ...] = ()
    leak: Curve = flat()
    non_torch: Curve = flat()
    heap: Curve = flat()
    resident_base: int = 6 * GIB
    nvml: bool = True
    observes: bool = True
    discovers: bool = True
    hung_at: int | None = None
    """Minute from which the process stops beating (and keeps its memory)."""
    restarted_at: int | None = None
    """Minute a new process replaces it (after a hang: the hung one is killed)."""
    ended_at: int | None = None
    """Minute the process shuts down cleanly (marks its snapshot ended, frees its memory)."""
    died_at: int | None = None
    """Minute the process dies of ``died_of`` (frees its memory; a ``restarted_at`` after it starts a new one)."""
    died_of: str = "out_of_memory"
    """Why: ``out_of_memory`` or ``error`` (the hook ends its snapshot with that reason and its memory then), or
    ``vanished`` (killed: its snapshot stays as it was, and its liveness lock is let go)."""
    emptied_at: tuple[int, ...] = ()
    """Minutes at which vLLM empties torch's cache (``torch.cuda.empty_cache``)."""
    max_num_seqs: int = 8
    extensible: ExtensibleKV | None = None
    """vLLM 0.34's extensible KV cache: ``paged_kv`` lives outside torch, committed in steps."""
    sleeps: tuple[Sleep, ...] = ()
    """vLLM's sleep mode: when the engine sleeps, and at which level."""
    sleep_tags: tuple[str, ...] = SLEEP_TAGS_030
    """What the sleep allocator holds (and unmaps while the engine sleeps)."""
    dp_index: int | None = None
    """The data-parallel replica's index (vLLM's ``data_parallel_index``), where the engine is one."""

    @property
    def key(self) -> tuple[str, str]:
        """Engines are told apart by exporter instance and engine id (replicas share the id)."""
        return (self.instance, self.engine_id)

    def asleep(self, t: int) -> Sleep | None:
        """The sleep the engine is in at minute ``t`` (None: awake)."""
        return next((s for s in self.sleeps if s.covers(t)), None)


@dataclass
class Sample:
    """What one engine's hook reports at one minute, and whether its process holds device memory."""

    values: dict[str, int]
    baseline: dict[str, int] | None
    started_minute: int
    held: dict[str, tuple[int, int]]
    """Per declaring owner: bytes in the last window and most bytes since start."""
    discovered: Discovered
    calls: int
    process_gpu: int = 0
    recorded: dict[str, int] = field(default_factory=dict)
    """The settings the hook has recorded by this minute (``EngineSettings`` field names; absent: not yet)."""
    sleep_level: int = 0
    off_device: dict[str, int] = field(default_factory=dict)
    """Per tag, the bytes vLLM's sleep allocator holds off the device (its books)."""
    truth: dict[str, int] | None = None
    """Once the engine is ready: what each part of the memory breakdown holds, as the physics knows it, and
    ``unexplained``: the memory no part names (a leak, memory made outside torch, free blocks beyond the
    activation allowance, activations live at a busy sample, caches nothing finds or that stay under the floor, freed heap a CPU engine keeps)."""
    capture_drop: int | None = None
    """What vLLM's ``capture_model`` returns: the drop in the device's free memory across the capture, the
    graph pools and whatever else the device's processes allocated meanwhile (not what the hook records)."""


@dataclass
class _Process:
    start: int
    reserved: int = 0
    peak_allocated: int = 0
    previous_window: int = 0
    previous_floor: int | None = None
    retained: int = 0
    lifetime: dict[str, int] = field(default_factory=dict)
    baseline: dict[str, int] | None = None
    runtime: int | None = None
    capture_drop: int | None = None
    previous_gpu: int = 0


@dataclass
class Timeline:
    """Every engine's reported sample at every minute (None: no process), and its heartbeat minute."""

    samples: dict[tuple[str, str], list[Sample | None]]
    heartbeats: dict[tuple[str, str], list[int | None]]


@dataclass(frozen=True)
class _Caches:
    total: int
    named: int
    """What the breakdown can name: observed declaring owners' caches, and owners discovery publishes."""
    held: dict[str, tuple[int, int]]
    discovered: Discovered


def _live(engine: Engine, t: int, process: _Process) -> _Caches:
    """Bytes the caches hold at ``t``, of which the breakdown can name, and per owner (declaring, then undeclared)
    now and most since start."""
    now: dict[str, int] = {}
    for cache in engine.caches:
        now[cache.owner] = now.get(cache.owner, 0) + cache.held(t)
    for owner, value in now.items():
        process.lifetime[owner] = max(process.lifetime.get(owner, 0), value)
    held = {owner: (value, process.lifetime[owner]) for owner, value in now.items()}
    discovered: Discovered = {}
    undeclared: dict[str, int] = {}
    published: dict[str, int] = {}
    for found in engine.undeclared:
        value, key = found.held(t), f"{found.owner}/{found.found_by}"
        process.lifetime[key] = max(process.lifetime.get(key, 0), value)
        discovered[(found.owner, found.found_by)] = (value, process.lifetime[key])
        undeclared[found.owner] = max(undeclared.get(found.owner, 0), value)
        if engine.discovers and process.lifetime[key] >= DISCOVERY_FLOOR:
            published[found.owner] = max(published.get(found.owner, 0), value)
    named = (sum(now.values()) if engine.observes else 0) + sum(published.values())
    return _Caches(sum(now.values()) + sum(undeclared.values()), named, held, discovered)


def _host_sample(engine: Engine, t: int, process: _Process, ready: bool, caches: _Caches, calls: int) -> Sample:
    """A CPU engine's sample: its resident memory, the rest of its memory plan in host memory."""
    loaded = min(1.0, (t - process.start + 1) / engine.load_minutes)
    process.retained = max(process.retained, caches.total)
    resident = engine.resident_base + process.retained + engine.heap(t) + engine.leak(t)
    values = {"process_resident": resident if ready else int(engine.resident_base * loaded)}
    recorded = {"runtime_bytes": HOST_RUNTIME}
    truth = None
    if ready:
        if process.baseline is None:
            process.baseline = dict(values)
        recorded["weights_bytes"] = engine.resident_base - HOST_RUNTIME
        unnamed = process.retained - caches.total + engine.heap(t) + engine.leak(t) + caches.total - caches.named
        truth = {
            "runtime": HOST_RUNTIME,
            "weights": engine.resident_base - HOST_RUNTIME,
            "model_local_caches": caches.named,
            "unexplained": unnamed,
        }
    return Sample(
        values, process.baseline, process.start, caches.held, caches.discovered, calls, recorded=recorded, truth=truth
    )


def _sample(engine: Engine, t: int, process: _Process) -> Sample:
    since = t - process.start
    load = engine.load_minutes
    ready = since >= load
    loaded = min(1.0, (since + 1) / load)
    caches = _live(engine, t, process) if ready else _Caches(0, 0, {}, {})
    calls = max(0, since - load) * 30
    if engine.device is None:
        return _host_sample(engine, t, process, ready, caches, calls)

    sleep = engine.asleep(t) if ready else None
    extensible = engine.extensible
    in_torch_kv = 0 if extensible is not None else engine.paged_kv
    committed = 0 if extensible is None else extensible.committed(since, load, engine.paged_kv, sleep is not None)
    graphs = engine.graphs if since >= load - 1 else 0
    if not ready:
        live = engine.runtime_buffers + int(engine.weights * loaded)
        window = live
    else:
        live = engine.runtime_buffers + engine.weights + in_torch_kv + caches.total + engine.leak(t)
        window = live + engine.activation(t)
    if not ready:
        process.reserved = max(process.reserved, live)
    elif process.baseline is None:
        process.reserved = live
    elif t in engine.emptied_at:
        process.reserved = window
    else:
        process.reserved = max(process.reserved, window)
    high_water = max(window, process.previous_window) if process.baseline is not None else live
    process.previous_window = window
    busy = engine.busy(t) if process.baseline is not None else 0
    assert busy <= engine.activation(t) or not busy, f"{engine.engine_id}: busier than its activations"
    at_sample = live + busy
    before = process.previous_floor
    low_water = min(at_sample, before) if process.baseline is not None and before is not None else at_sample
    process.previous_floor = at_sample
    process.peak_allocated = max(process.peak_allocated, window)
    pooled = {
        WEIGHTS_TAG: engine.weights,
        KV_CACHE_TAG: in_torch_kv,
        CUDAGRAPH_TAG: graphs,
        RUNTIME_TAG: engine.runtime_buffers,
    }
    off_device = {tag: pooled[tag] for tag in engine.sleep_tags if pooled.get(tag)} if sleep is not None else {}
    process_gpu = (
        process.reserved
        + graphs
        + engine.context
        + (engine.non_torch(t) if ready else 0)
        + committed
        - sum(off_device.values())
    )
    if process.runtime is None:
        process.runtime = engine.context + engine.runtime_buffers
    offloaded = engine.weights if sleep is not None and sleep.level == 1 and WEIGHTS_TAG in off_device else 0
    values = {
        "torch_allocated": at_sample,
        "torch_allocated_high_water": high_water,
        "torch_peak_allocated": process.peak_allocated,
        "torch_reserved": process.reserved + graphs,
        "process_resident": engine.resident_base + engine.heap(t) + offloaded,
        "device_total": engine.device.total,
    }
    if engine.floor:
        values["torch_allocated_low_water"] = low_water
    if engine.nvml:
        values["process_gpu"] = process_gpu
    if extensible is not None:
        values["paged_kv_committed"] = committed
    early = extensible is not None and extensible.baseline_at_warm_up
    settled = ready or early and since >= load - 1
    if settled and process.baseline is None:
        process.baseline = {k: values[k] for k in ("torch_allocated", "torch_reserved", "process_resident")}
        process.baseline["torch_allocated_high_water"] = live + engine.profiled_activation_peak
        if engine.nvml:
            process.baseline["process_gpu"] = process_gpu
        if extensible is not None:
            process.baseline["paged_kv_committed"] = committed
    sample = Sample(
        values,
        process.baseline,
        process.start,
        caches.held,
        caches.discovered,
        calls,
        process_gpu,
        recorded=_recorded(engine, since, process),
        sleep_level=0 if sleep is None else sleep.level,
        off_device=off_device,
        capture_drop=process.capture_drop,
    )
    if ready:
        kept = process.reserved - at_sample  # free blocks: the activations live at a busy sample are tensors
        allowance = engine.profiled_activation_peak
        sample.truth = {
            "runtime": process.runtime - off_device.get(RUNTIME_TAG, 0),
            "weights": engine.weights - off_device.get(WEIGHTS_TAG, 0),
            "paged_kv": committed if extensible is not None else in_torch_kv - off_device.get(KV_CACHE_TAG, 0),
            "cuda_graphs": graphs - off_device.get(CUDAGRAPH_TAG, 0),
            "activation_peak": min(allowance, kept),
            "model_local_caches": caches.named,
            "unexplained": engine.leak(t)
            + engine.non_torch(t)
            + max(0, kept - allowance)
            + busy
            + caches.total
            - caches.named,
        }
    return sample


def _recorded(engine: Engine, since: int, process: _Process) -> dict[str, int]:
    """The settings a GPU engine's hook has recorded ``since`` minutes after its process started.

    The runtime after ``init_device`` (NVML's figure for the process; unknown without NVML); an
    extensible KV cache's reservation and first commit at ``initialize_from_config``, four minutes
    before the engine is ready; once it is ready, the weights, the paged KV cache (the final commit of
    an extensible one), the activation peak vLLM profiled and the graph pools captured.
    """
    recorded: dict[str, int] = {}
    if engine.nvml and process.runtime is not None:
        recorded["runtime_bytes"] = process.runtime
    load = engine.load_minutes
    extensible = engine.extensible
    if extensible is not None and since >= load - 4:
        recorded["paged_kv_bytes"] = engine.paged_kv if since >= load else NULL_BLOCK
        recorded["paged_kv_reserved_bytes"] = extensible.reserved
        recorded["torch_headroom_bytes"] = engine.profiled_activation_peak
    if since >= load:
        recorded["weights_bytes"] = engine.weights
        recorded["paged_kv_bytes"] = engine.paged_kv
        recorded["activation_peak_bytes"] = engine.profiled_activation_peak
        recorded["cuda_graph_bytes"] = engine.graphs
        recorded["cuda_graph_free_bytes"] = engine.graphs
    return recorded


def _processes(engine: Engine, t: int) -> tuple[int | None, bool]:
    """The start minute of the process alive at ``t`` (None: none) and whether it beats."""
    if engine.ended_at is not None and t >= engine.ended_at or t < engine.started:
        return None, False
    if engine.restarted_at is not None and t >= engine.restarted_at:
        return engine.restarted_at, True
    if engine.died_at is not None and t >= engine.died_at:
        return None, False
    return engine.started, engine.hung_at is None or t < engine.hung_at


def simulate(engines: list[Engine], minutes: int) -> Timeline:
    """Every engine's samples for minutes 0..``minutes``, with the device figures filled in; relations asserted."""
    keys = [e.key for e in engines]
    assert len(set(keys)) == len(keys), f"two engines write one snapshot file: {sorted(keys)}"
    samples: dict[tuple[str, str], list[Sample | None]] = {e.key: [] for e in engines}
    beats: dict[tuple[str, str], list[int | None]] = {e.key: [] for e in engines}
    processes: dict[tuple[tuple[str, str], int], _Process] = {}
    frozen: dict[tuple[str, str], Sample] = {}
    last_beat: dict[tuple[str, str], int] = {}
    previous_used: dict[str, int] = {}
    for t in range(-max(0, -min(e.started for e in engines)), minutes + 1):
        now: dict[tuple[str, str], Sample | None] = {}
        alive: dict[tuple[str, str], _Process] = {}
        for engine in engines:
            start, beating = _processes(engine, t)
            if start is None:
                now[engine.key] = None
                continue
            process = alive[engine.key] = processes.setdefault((engine.key, start), _Process(start))
            if beating:
                frozen[engine.key] = _sample(engine, t, process)
                last_beat[engine.key] = t
            now[engine.key] = frozen[engine.key]
        used: dict[str, int] = {}
        for engine in engines:
            sample = now[engine.key]
            if engine.device is not None and sample is not None:
                held = used.get(engine.device.uuid, engine.device.others_at(t))
                used[engine.device.uuid] = held + sample.process_gpu
        for engine in engines:
            sample = now[engine.key]
            if engine.device is None or sample is None:
                continue
            if last_beat.get(engine.key) == t:
                sample.values["device_used"] = used[engine.device.uuid]
                if sample.baseline is not None and "device_used" not in sample.baseline:
                    sample.baseline["device_used"] = used[engine.device.uuid]
                _capture(
                    engine,
                    t,
                    alive[engine.key],
                    sample,
                    used[engine.device.uuid] - previous_used.get(engine.device.uuid, 0),
                )
            check(engine, sample, used[engine.device.uuid])
        previous_used = used
        if t >= 0:
            for engine in engines:
                samples[engine.key].append(now[engine.key])
                beats[engine.key].append(last_beat.get(engine.key) if now[engine.key] is not None else None)
    return Timeline(samples, beats)


def _capture(engine: Engine, t: int, process: _Process, sample: Sample, device_grew: int) -> None:
    """At the minute the engine captures its graphs, what ``capture_model`` would return: the graph pools and
    what every other process on the device allocated in that minute."""
    if t - process.start == engine.load_minutes - 1 and engine.graphs:
        own = sample.process_gpu - process.previous_gpu
        process.capture_drop = sample.capture_drop = engine.graphs + device_grew - own
    process.previous_gpu = sample.process_gpu


def check(engine: Engine, sample: Sample, device_used: int) -> None:
    """The physical relations: allocated <= reserved; reserved, less what the sleep allocator holds off the device,
    <= process GPU memory <= device used <= total.

    While the engine sleeps torch's reserved memory may exceed NVML's figure for the process: the sleep
    allocator's segments stay reserved in torch while their pages are unmapped.
    """
    v = sample.values
    asleep = sum(sample.off_device.values())
    assert v["torch_allocated"] <= v["torch_allocated_high_water"] or sample.baseline is None, engine.engine_id
    assert v.get("torch_allocated_low_water", 0) <= v["torch_allocated"], engine.engine_id
    assert v["torch_allocated"] <= v["torch_reserved"], engine.engine_id
    assert v["torch_reserved"] - asleep <= sample.process_gpu, engine.engine_id
    assert v["torch_peak_allocated"] >= v["torch_allocated"], engine.engine_id
    assert "process_gpu" not in v or v["process_gpu"] <= device_used, engine.engine_id
    assert sample.process_gpu <= device_used <= v["device_total"], f"{engine.engine_id}: device over-full"
