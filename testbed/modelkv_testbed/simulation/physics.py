"""Engines and devices minute by minute: what each engine process holds, and what each device has in use.

A GPU engine's live tensors are its weights, its paged KV cache, what its model-local caches
hold, what undeclared owners hold and what leaks. Each sample window adds a transient activation
peak on top; torch's caching allocator keeps the highest window peak since start (or since vLLM
last emptied it), so ``torch_reserved`` only grows between those points. NVML's figure for the
process is the allocator's memory plus the CUDA context and whatever the process allocated outside
torch. A device's used memory is the sum over every process on it, hung ones included, plus
processes that publish no snapshot. A CPU engine's resident memory keeps the most its caches ever
held (the C allocator rarely returns freed heap) plus its own heap growth.

A vLLM 0.34 engine with an extensible KV cache (``ExtensibleKV``) keeps its paged KV cache outside
torch: pages mapped by the driver, in NVML's figure and the device's but in no torch figure, and
committed in steps (reserve, warm-up, the final extend, released while asleep).
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
    """One GPU; ``others`` is memory held by processes that publish no snapshot."""

    uuid: str
    total: int = 80 * GIB
    others: int = 0


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
    ``paged_kv`` lands when the engine is ready. While asleep (``sleeps``: story minutes ``[start,
    stop)``) the pages are released and then recommitted.
    """

    reserved: int = 120 * GIB
    warm_up: int = 8 * GIB
    eager: bool = False
    sleeps: tuple[tuple[int, int], ...] = ()
    baseline_at_warm_up: bool = False
    """The hook before vLLM 0.34 support: its baseline at the end of warm-up, before the final commit."""

    def committed(self, t: int, start: int, load_minutes: int, final: int) -> int:
        """Bytes mapped at story minute ``t`` of a process that started at ``start``."""
        since = t - start
        if since < load_minutes - 4:
            return 0
        if since == load_minutes - 4:
            return NULL_BLOCK
        if since < load_minutes - 1:
            return NULL_BLOCK + self.warm_up
        if since < load_minutes:
            return NULL_BLOCK + self.warm_up if self.eager else NULL_BLOCK
        return 0 if any(a <= t < b for a, b in self.sleeps) else final


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
    started: int = -600
    """Story minute the engine process started publishing (negative: long before the story)."""
    load_minutes: int = 10
    weights: int = 16 * GIB
    paged_kv: int = 30 * GIB
    context: int = GIB
    activation_budget: int = 2 * GIB
    activation: Curve = flat()
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
    emptied_at: tuple[int, ...] = ()
    """Minutes at which vLLM empties torch's cache (``torch.cuda.empty_cache``)."""
    max_num_seqs: int = 8
    extensible: ExtensibleKV | None = None
    """vLLM 0.34's extensible KV cache: ``paged_kv`` lives outside torch, committed in steps."""

    @property
    def key(self) -> tuple[str, str]:
        """Engines are told apart by exporter instance and engine id (replicas share the id)."""
        return (self.instance, self.engine_id)


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


@dataclass
class _Process:
    start: int
    reserved: int = 0
    peak_allocated: int = 0
    previous_window: int = 0
    retained: int = 0
    lifetime: dict[str, int] = field(default_factory=dict)
    baseline: dict[str, int] | None = None


@dataclass
class Timeline:
    """Every engine's reported sample at every minute (None: no process), and its heartbeat minute."""

    samples: dict[tuple[str, str], list[Sample | None]]
    heartbeats: dict[tuple[str, str], list[int | None]]


def _live(engine: Engine, t: int, process: _Process) -> tuple[int, dict[str, tuple[int, int]], Discovered]:
    """Bytes the caches hold at ``t``, and per owner (declaring, then undeclared) now and most since start."""
    now: dict[str, int] = {}
    for cache in engine.caches:
        now[cache.owner] = now.get(cache.owner, 0) + cache.held(t)
    for owner, value in now.items():
        process.lifetime[owner] = max(process.lifetime.get(owner, 0), value)
    held = {owner: (value, process.lifetime[owner]) for owner, value in now.items()}
    discovered: Discovered = {}
    undeclared: dict[str, int] = {}
    for found in engine.undeclared:
        value, key = found.held(t), f"{found.owner}/{found.found_by}"
        process.lifetime[key] = max(process.lifetime.get(key, 0), value)
        discovered[(found.owner, found.found_by)] = (value, process.lifetime[key])
        undeclared[found.owner] = max(undeclared.get(found.owner, 0), value)
    return sum(now.values()) + sum(undeclared.values()), held, discovered


def _sample(engine: Engine, t: int, process: _Process) -> Sample:
    ready = t >= process.start + engine.load_minutes
    loaded = min(1.0, (t - process.start + 1) / engine.load_minutes)
    caches, held, discovered = _live(engine, t, process) if ready else (0, {}, {})
    calls = max(0, t - process.start - engine.load_minutes) * 30
    if engine.device is None:
        process.retained = max(process.retained, caches)
        resident = engine.resident_base + process.retained + engine.heap(t) + engine.leak(t) if ready else 0
        values = {"process_resident": resident if ready else int(engine.resident_base * loaded)}
        if ready and process.baseline is None:
            process.baseline = dict(values)
        return Sample(values, process.baseline, process.start, held, discovered, calls)

    extensible = engine.extensible
    in_torch_kv = 0 if extensible is not None else engine.paged_kv
    committed = (
        0 if extensible is None else extensible.committed(t, process.start, engine.load_minutes, engine.paged_kv)
    )
    if not ready:
        live = int(engine.weights * loaded)
        window = live
    else:
        live = engine.weights + in_torch_kv + caches + engine.leak(t)
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
    process.peak_allocated = max(process.peak_allocated, window)
    process_gpu = process.reserved + engine.context + (engine.non_torch(t) if ready else 0) + committed
    values = {
        "torch_allocated": live,
        "torch_allocated_high_water": high_water,
        "torch_peak_allocated": process.peak_allocated,
        "torch_reserved": process.reserved,
        "process_resident": engine.resident_base + engine.heap(t),
        "device_total": engine.device.total,
    }
    if engine.nvml:
        values["process_gpu"] = process_gpu
    if extensible is not None:
        values["paged_kv_committed"] = committed
    early = extensible is not None and extensible.baseline_at_warm_up
    settled = ready or early and t >= process.start + engine.load_minutes - 1
    if settled and process.baseline is None:
        process.baseline = {k: values[k] for k in ("torch_allocated", "torch_reserved", "process_resident")}
        process.baseline["torch_allocated_high_water"] = live + engine.activation_budget
        if engine.nvml:
            process.baseline["process_gpu"] = process_gpu
        if extensible is not None:
            process.baseline["paged_kv_committed"] = committed
    return Sample(values, process.baseline, process.start, held, discovered, calls, process_gpu)


def _processes(engine: Engine, t: int) -> tuple[int | None, bool]:
    """The start minute of the process alive at ``t`` (None: none) and whether it beats."""
    if engine.ended_at is not None and t >= engine.ended_at or t < engine.started:
        return None, False
    if engine.restarted_at is not None and t >= engine.restarted_at:
        return engine.restarted_at, True
    return engine.started, engine.hung_at is None or t < engine.hung_at


def simulate(engines: list[Engine], minutes: int) -> Timeline:
    """Every engine's samples for minutes 0..``minutes``, with the device figures filled in; relations asserted."""
    samples: dict[tuple[str, str], list[Sample | None]] = {e.key: [] for e in engines}
    beats: dict[tuple[str, str], list[int | None]] = {e.key: [] for e in engines}
    processes: dict[tuple[tuple[str, str], int], _Process] = {}
    frozen: dict[tuple[str, str], Sample] = {}
    last_beat: dict[tuple[str, str], int] = {}
    for t in range(-max(0, -min(e.started for e in engines)), minutes + 1):
        now: dict[tuple[str, str], Sample | None] = {}
        for engine in engines:
            start, beating = _processes(engine, t)
            if start is None:
                now[engine.key] = None
                continue
            process = processes.setdefault((engine.key, start), _Process(start))
            if beating:
                frozen[engine.key] = _sample(engine, t, process)
                last_beat[engine.key] = t
            now[engine.key] = frozen[engine.key]
        used: dict[str, int] = {}
        for engine in engines:
            sample = now[engine.key]
            if engine.device is not None and sample is not None:
                used[engine.device.uuid] = used.get(engine.device.uuid, engine.device.others) + sample.process_gpu
        for engine in engines:
            sample = now[engine.key]
            if engine.device is None or sample is None:
                continue
            if last_beat.get(engine.key) == t:
                sample.values["device_used"] = used[engine.device.uuid]
                if sample.baseline is not None and "device_used" not in sample.baseline:
                    sample.baseline["device_used"] = used[engine.device.uuid]
            check(engine, sample, used[engine.device.uuid])
        if t >= 0:
            for engine in engines:
                samples[engine.key].append(now[engine.key])
                beats[engine.key].append(last_beat.get(engine.key) if now[engine.key] is not None else None)
    return Timeline(samples, beats)


def check(engine: Engine, sample: Sample, device_used: int) -> None:
    """The physical relations: allocated <= reserved <= process GPU memory <= device used <= total."""
    v = sample.values
    assert v["torch_allocated"] <= v["torch_allocated_high_water"] or sample.baseline is None, engine.engine_id
    assert v["torch_allocated"] <= v["torch_reserved"] <= sample.process_gpu, engine.engine_id
    assert v["torch_peak_allocated"] >= v["torch_allocated"], engine.engine_id
    assert "process_gpu" not in v or v["process_gpu"] <= device_used, engine.engine_id
    assert sample.process_gpu <= device_used <= v["device_total"], f"{engine.engine_id}: device over-full"
