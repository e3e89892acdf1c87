"""The series a real sidecar exports for a simulated timeline, minute by minute, as promtool input.

Each engine's state becomes a real ``Snapshot``, and the sidecar's own ``shown_samples``,
``exporter_samples`` and ``refusal_samples`` say which series exist and with which labels; the
scrape adds ``job``, ``instance``, ``namespace`` and ``pod``, and Prometheus its ``up`` and
``scrape_duration_seconds``. A series that disappears gets a staleness marker, as a scrape that
no longer returns it writes one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from prometheus_client.parser import text_string_to_metric_families

from modelkv_exporter.contract.snapshot import (
    Declaration,
    DiscoveredOwner,
    DiscoveryStatus,
    EndState,
    EngineIdentity,
    EngineSettings,
    KVLayout,
    Measured,
    MemorySample,
    Observation,
    SleepState,
    Snapshot,
)
from modelkv_exporter.contract.vocabulary import EndReason
from modelkv_exporter.sidecar.budget import Budget
from modelkv_exporter.sidecar.catalogue import CATALOGUE
from modelkv_exporter.sidecar.labels import engine_labels
from modelkv_exporter.sidecar.reader.state import LIVE_STATES, EngineState
from modelkv_exporter.sidecar.samples import exporter_samples, refusal_samples, shown_samples
from modelkv_testbed.simulation.physics import (
    DISCOVERY_FLOOR,
    FORGET_AFTER_S,
    KV_CACHE_TAG,
    STALE_AFTER_S,
    Engine,
    Sample,
    Timeline,
)
from modelkv_testbed.snapshots import make_declaration

JOB = "modelkv-exporter"
NAMESPACE = "llm"
POSITION_BYTES = 2 * 32 * 8 * 128 * 2
"""Bytes of one position of one row of every simulated cache: 32 layers, 8 KV heads of 128, bfloat16."""
SIMULATED_VERSION = "0+simulated"
"""The build_info version label: the installed version would make the files depend on the environment."""
Labels = tuple[tuple[str, str], ...]
Series = dict[tuple[str, Labels], list[float | None]]


def declaration(engine: Engine, index: int) -> Declaration:
    """The engine's ``index``-th cache as its declarer resolves it at ``max_num_seqs``."""
    cache = engine.caches[index]
    fixed = cache.fixed_rows is not None
    return make_declaration(
        cache.name,
        owner=cache.owner,
        layers=32,
        kv_heads=8,
        head_dim=128,
        positions=cache.row_bytes // POSITION_BYTES,
        element_size=2,
        rows="fixed" if fixed else "max_num_seqs",
        rows_fixed=cache.fixed_rows or 1,
        max_num_seqs=engine.max_num_seqs,
        capacity_source="max_model_len",
    )


def _layout() -> KVLayout:
    return KVLayout(layers=32, kv_heads=8, head_dim=128, dtype="bfloat16", element_size=2, positions=4096, rows=4)


def _discovered(engine: Engine, sample: Sample) -> tuple[tuple[DiscoveredOwner, ...], int]:
    found = [(owner, "cache_layer", now, peak, True) for owner, (now, peak) in sample.held.items()]
    found += [(owner, by, now, peak, False) for (owner, by), (now, peak) in sample.discovered.items()]
    published = tuple(
        DiscoveredOwner(owner, "Owner", by, peak, now, 0 if declares else now, declares, storages=2, layout=_layout())
        for owner, by, now, peak, declares in found
        if peak >= DISCOVERY_FLOOR
    )  # a declaring owner's caches are observed: it holds nothing beyond them now (its live bytes are 0)
    return published, len(found) - len(published)


def sleep_state(engine: Engine, sample: Sample) -> SleepState:
    """The sleep state the hook publishes: every vLLM worker has ``sleep``. The level, and the sleep allocator's
    books of what is off the device (an extensible KV cache whose pages are released counts under ``kv_cache``)."""
    released = dict(sample.off_device)
    if engine.extensible is not None and sample.sleep_level and sample.values.get("paged_kv_committed") == 0:
        released[KV_CACHE_TAG] = released.get(KV_CACHE_TAG, 0) + sample.recorded["paged_kv_bytes"]
    return SleepState(level=sample.sleep_level, released=released)


def snapshot(engine: Engine, sample: Sample, beat: int) -> Snapshot:
    """The snapshot the engine's hook last wrote, at minute ``beat``."""
    gpu = engine.device is not None
    observations = tuple(
        Observation(owner, "Owner", True, None, peak, now, now, sample.calls, sample.calls)
        for owner, (now, peak) in sample.held.items()
    )
    discovered, below_floor = _discovered(engine, sample) if engine.discovers else ((), 0)
    status = DiscoveryStatus(True, None, beat * 60.0, 0.4, 900, 40000, None, below_floor, 0)
    recorded = sample.recorded
    kv = recorded.get("paged_kv_bytes")
    reserved = recorded.get("paged_kv_reserved_bytes")
    return Snapshot(
        engine=EngineIdentity(
            engine_id=engine.engine_id,
            served_model_name=engine.model,
            architecture=engine.architecture,
            stage_name=engine.stage or None,
            tp_rank=0,
            dp_index=engine.dp_index,
            device=engine.device.uuid if engine.device is not None else "cpu",
        ),
        settings=EngineSettings(
            max_num_seqs=engine.max_num_seqs,
            gpu_memory_utilization=0.9 if gpu else None,
            paged_kv_bytes=kv,
            paged_kv_blocks=None if kv is None else kv // (2 * 1024**2),
            paged_kv_reserved_bytes=reserved,
            paged_kv_reserved_blocks=None if reserved is None else reserved // (2 * 1024**2),
            weights_bytes=recorded.get("weights_bytes"),
            activation_peak_bytes=recorded.get("activation_peak_bytes"),
            cuda_graph_bytes=recorded.get("cuda_graph_bytes"),
            cuda_graph_free_bytes=recorded.get("cuda_graph_free_bytes"),
            runtime_bytes=recorded.get("runtime_bytes"),
            torch_headroom_bytes=recorded.get("torch_headroom_bytes"),
        ),
        declarations=tuple(declaration(engine, i) for i in range(len(engine.caches))),
        started_at=sample.started_minute * 60.0,
        heartbeat_at=beat * 60.0,
        measured=Measured(
            MemorySample(beat * 60.0, dict(sample.values)),
            None if sample.baseline is None else MemorySample(beat * 60.0, dict(sample.baseline)),
        ),
        heartbeat_interval_seconds=5.0,
        writer="modelkv-exporter (simulated)",
        observations=observations if engine.observes else (),
        dropped_declarations=(),
        discovered=discovered,
        discovery=status if engine.discovers else None,
        sleep=sleep_state(engine, sample),
    )


@dataclass(frozen=True)
class ScrapeGap:
    """Minutes ``start`` to ``stop`` (not included) in which Prometheus cannot scrape the sidecar at ``instance``.

    The sidecar restarts or its node is unreachable: Prometheus records ``up`` 0 and a staleness
    marker for every series the target returned before. Where the pod is ``deleted``, the target is
    gone instead: ``up`` goes stale with every other series, and nothing is recorded after it.
    """

    instance: str
    start: int
    stop: int
    deleted: bool = False

    def covers(self, instance: str, t: int) -> bool:
        """Whether the scrape of ``instance`` at minute ``t`` fails."""
        return instance == self.instance and self.start <= t < self.stop


class _Add:
    """Collects one scrape's samples of one exporter instance."""

    def __init__(self, scrape: dict[tuple[str, Labels], float], target: dict[str, str]) -> None:
        self.scrape, self.target = scrape, target

    def __call__(self, name: str, values: list[str], value: float) -> None:
        if name == "modelkv_exporter_build_info":
            values = [SIMULATED_VERSION, *values[1:]]
        names = CATALOGUE[name].labels
        labels = {**self.target, **dict(zip(names, values, strict=True))}
        key = (name, tuple(sorted(labels.items())))
        assert key not in self.scrape, f"two samples of {key}"
        self.scrape[key] = float(value)

    def info(self, name: str, values: list[str]) -> None:
        self(name, values, 1.0)


def _state(engine: Engine, sample: Sample | None, beat: int | None, t: int) -> EngineState | None:
    """The engine's file's state at minute ``t`` (None: no file)."""
    if sample is None or beat is None:
        if engine.ended_at is not None and t >= engine.ended_at:
            return EngineState.ENDED if (t - engine.ended_at + 1) * 60 <= FORGET_AFTER_S else EngineState.FORGOTTEN
        return None
    age = (t - beat) * 60
    if age <= STALE_AFTER_S:
        return EngineState.EXPORTED
    return EngineState.STALE if age <= FORGET_AFTER_S else EngineState.FORGOTTEN


def _dead_state(engine: Engine, beat: int, t: int) -> EngineState | None:
    """The state at minute ``t`` of the file a died engine left at minute ``beat`` (None: it has not died)."""
    if engine.died_at is None or t < engine.died_at:
        return None
    age = (t - beat) * 60
    if age > FORGET_AFTER_S:
        return EngineState.FORGOTTEN
    if engine.died_of != EndReason.VANISHED.value:
        return EngineState.ENDED
    return EngineState.EXPORTED if age <= STALE_AFTER_S else EngineState.VANISHED


def _ended(engine: Engine, snap: Snapshot, sample: Sample) -> Snapshot:
    """The ending write of an engine that died of ``died_of`` (not vanished): its last sample, and why."""
    if engine.died_of == EndReason.VANISHED.value:
        return snap
    free = sample.values["torch_reserved"] - sample.values["torch_allocated"] if engine.device is not None else None
    error = "torch.OutOfMemoryError: CUDA out of memory" if engine.died_of == "out_of_memory" else "RuntimeError"
    return replace(snap, ended=True, end=EndState(engine.died_of, snap.heartbeat_at, error, free))


def scrapes(
    engines: list[Engine], timeline: Timeline, minutes: int, gaps: Sequence[ScrapeGap] = ()
) -> Iterator[dict[tuple[str, Labels], float]]:
    """Every minute's scrape of every exporter instance: the samples Prometheus stores."""
    pods = {engine.instance: engine.pod for engine in engines}
    last: dict[tuple[str, str], tuple[Sample, int]] = {}
    for t in range(minutes + 1):
        scrape: dict[tuple[str, Labels], float] = {}
        counts = {instance: dict.fromkeys(EngineState, 0) for instance in pods}
        for instance, pod in pods.items():
            missed = [gap for gap in gaps if gap.covers(instance, t)]
            if any(gap.deleted for gap in missed):
                continue
            if missed:
                target = tuple(sorted({"job": JOB, "instance": instance, "namespace": NAMESPACE, "pod": pod}.items()))
                scrape[("up", target)] = 0.0
                scrape[("scrape_duration_seconds", target)] = 10.0
                continue
            add = _Add(scrape, {"job": JOB, "instance": instance, "namespace": NAMESPACE, "pod": pod})
            for engine in (e for e in engines if e.instance == instance):
                sample, beat = timeline.samples[engine.key][t], timeline.heartbeats[engine.key][t]
                state = _state(engine, sample, beat, t)
                if sample is not None and beat is not None:
                    last[engine.key] = (sample, beat)
                elif engine.key in last:
                    sample, beat = last[engine.key]
                    state = _dead_state(engine, beat, t) or state
                if state is not None:
                    counts[instance][state] += 1
                if state in (None, EngineState.FORGOTTEN) or sample is None or beat is None:
                    continue
                snap = snapshot(engine, sample, beat)
                if engine.died_at is not None and t >= engine.died_at and state is not EngineState.EXPORTED:
                    snap = _ended(engine, snap, sample)
                shown_samples(snap, state, add, add.info, Budget().sidecar_max_discovered_owners)
                if state in LIVE_STATES:
                    add("modelkv_engine_snapshot_age_seconds", engine_labels(snap), (t - beat) * 60.0)
            exporter_samples(True, counts[instance], {}, add, add.info)
            add("modelkv_exporter_collect_duration_seconds", [], 0.004)
            refusal_samples({}, add)
            target = tuple(sorted({"job": JOB, "instance": instance, "namespace": NAMESPACE, "pod": pod}.items()))
            scrape[("up", target)] = 1.0
            scrape[("scrape_duration_seconds", target)] = 0.012
        yield scrape


def series(engines: list[Engine], timeline: Timeline, minutes: int, gaps: Sequence[ScrapeGap] = ()) -> Series:
    """Each series' value at every minute (None: not scraped)."""
    found: Series = {}
    for t, scrape in enumerate(scrapes(engines, timeline, minutes, gaps)):
        for key, value in scrape.items():
            found.setdefault(key, [None] * (minutes + 1))[t] = value
    return found


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def values_text(values: list[float | None]) -> str:
    """promtool's expanding notation: runs of one value (``vxN``), of one step (``a+bxN``), blanks, staleness."""
    tokens: list[str] = []
    i, seen = 0, False
    while i < len(values):
        value = values[i]
        if value is None:
            j = i
            while j < len(values) and values[j] is None:
                j += 1
            run = j - i
            if seen:
                tokens.append("stale")
                run -= 1
            if run:
                tokens.append("_" if run == 1 else f"_x{run}")
            i = j
            continue
        seen = True
        j = i + 1
        delta = None if j >= len(values) or values[j] is None else values[j] - value  # type: ignore[operator]
        while j < len(values) and values[j] is not None and values[j] - values[j - 1] == delta:  # type: ignore[operator]
            j += 1
        count = j - i
        if delta == 0 or count < 3:
            if delta == 0:
                tokens.append(f"{_number(value)}x{count - 1}" if count > 1 else _number(value))
            else:
                tokens.append(_number(value))
                j = i + 1
        else:
            sign = "+" if delta >= 0 else "-"  # type: ignore[operator]
            tokens.append(f"{_number(value)}{sign}{_number(abs(delta))}x{count - 1}")  # type: ignore[arg-type]
        i = j
    return " ".join(tokens)


def selector(name: str, labels: Labels) -> str:
    """``name{label="value",...}`` with the values escaped."""
    inner = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in labels)
    return f"{name}{{{inner}}}"


def scraped_series(exposition: str, minutes: int, target: dict[str, str]) -> list[dict[str, str]]:
    """Every sample of one real scrape of ``exposition`` as promtool input series, the same at every minute for
    ``minutes``, with the labels a scrape of ``target`` adds, and its ``up`` series."""
    found = [{"series": selector("up", tuple(sorted(target.items()))), "values": f"1x{minutes}"}]
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            labels = tuple(sorted({**sample.labels, **target}.items()))
            found.append({"series": selector(sample.name, labels), "values": f"{sample.value:g}x{minutes}"})
    return found
