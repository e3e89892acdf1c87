"""Where an engine's memory goes: its process figure split into parts (``modelkv_memory_breakdown_bytes``).

Computed from one snapshot's figures, all of one sample, so the engine does no work for it. A device
engine (one that measures torch's caching allocator) splits the device memory NVML attributes to
its process (``process_gpu``); a host engine (a CPU engine, whose weights and caches live in host
memory) splits its resident memory (``process_resident``).

Every part is measured on its own, from its own source, and none is what is left of another: the
rest, ``unexplained``, is the process figure less the sum of the parts, so an error in any part shows
there (a part that counts too much makes it smaller, or negative; memory no part names, a leak or a
neighbour library's buffers, makes it larger). A part that cannot be known is absent, never 0, and the
rest is then absent too. No part but the rest is ever negative: what vLLM's sleep allocator holds off
the device comes off the part it belongs to, down to 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from modelkv_exporter.contract.sizes import human_bytes, signed_bytes
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.vocabulary import DiscoveryMethod


@dataclass(frozen=True)
class Component:
    """One part of an engine's memory: its ``component`` label, what it is, where its bytes come from and how they can
    be wrong."""

    name: str
    meaning: str
    source: str
    error: str
    host: bool
    """Whether a host engine has this part too (every part is a device engine's)."""


RUNTIME = "runtime"
WEIGHTS = "weights"
PAGED_KV = "paged_kv"
CUDA_GRAPHS = "cuda_graphs"
ACTIVATION_PEAK = "activation_peak"
MODEL_LOCAL_CACHES = "model_local_caches"
UNEXPLAINED = "unexplained"

COMPONENTS: tuple[Component, ...] = (
    Component(
        RUNTIME,
        "what the process held before its model loaded: the interpreter and its libraries, the CUDA context, "
        "communication buffers (NCCL, custom all-reduce) and the buffers the engine made up to then",
        "`settings.runtime_bytes`, the process figure measured once after vLLM's `init_device` (less what vLLM's "
        "sleep allocator holds off the device under its `runtime` tag)",
        "counts what the runtime gave back later (the rest is smaller); what libraries load or allocate later "
        "(kernels compiled at warm-up, NCCL's lazily made buffers) is not in it (the rest is larger)",
        True,
    ),
    Component(
        WEIGHTS,
        "the model's weights",
        "`settings.weights_bytes`: vLLM's `model_runner.model_memory_usage`, else the bytes of the model's "
        "parameters, buffers and computed weights (a legacy `weight_norm`'s or `spectral_norm`'s `weight`) on the "
        "engine's device, each storage once: not `meta` tensors, not weights offloaded to the host (`--cpu-offload-gb`); "
        "less what vLLM's sleep allocator holds off the device under its `weights` tag",
        "`model_memory_usage` is what loading took, temporary buffers kept by the loader included",
        True,
    ),
    Component(
        PAGED_KV,
        "vLLM's paged KV cache",
        "an extensible KV cache (vLLM 0.34): the bytes it has committed at the sample (`paged_kv_committed`); else "
        "`settings.paged_kv_bytes` less what vLLM's sleep allocator holds off the device under its `kv_cache` tag; "
        "absent for an engine without a paged KV cache",
        "none known: both are the cache's own figures",
        True,
    ),
    Component(
        CUDA_GRAPHS,
        "the CUDA graph pools",
        "`settings.cuda_graph_bytes`: the segments torch's caching allocator added to its private pools across "
        "vLLM's `capture_model` (0 for an engine that captures none); less what vLLM's sleep allocator holds off the "
        "device under its `cudagraph` tag",
        "another private pool growing during the capture counts here",
        False,
    ),
    Component(
        ACTIVATION_PEAK,
        "what torch's caching allocator keeps free for activations",
        "the free blocks torch's caching allocator holds (`torch_reserved` − `torch_allocated`) outside the graph "
        "pools (less `settings.cuda_graph_free_bytes`), at most the activation allowance: the peak vLLM profiled "
        "(`settings.activation_peak_bytes`) or, where larger, what vLLM 0.34 keeps free for torch "
        "(`settings.torch_headroom_bytes`)",
        "free blocks of the sleep allocator's pool count here too, up to the allowance; graph pools that gained or "
        "lost free blocks after the capture are off by that",
        False,
    ),
    Component(
        MODEL_LOCAL_CACHES,
        "caches the model keeps outside the paged KV cache, each counted once",
        "the live bytes of every observed owner's caches, plus every discovered owner's live bytes (a declaring "
        "owner's: beyond its declared caches; the larger figure where two methods found it) except an observed "
        "owner's that discovery repeats; absent while a declaring owner's caches cannot be observed",
        "a cache discovery cannot see (beyond its census budget) is not in it",
        True,
    ),
    Component(
        UNEXPLAINED,
        "what no part names: live tensors beyond the other parts (a leak shows here), free blocks torch keeps "
        "beyond the activation allowance, memory made outside torch after the model loaded (NCCL, kernels), and on a "
        "host engine the heap's activations; with it, every part's error",
        "the process figure less the sum of the other parts; present only when all of them are known (a part that "
        "is absent leaves it absent too); negative when the parts count more than the process holds",
        "it is the error of the others",
        True,
    ),
)
"""Every part, in the order they stack."""

COMPONENT_NAMES: tuple[str, ...] = tuple(c.name for c in COMPONENTS)
SLEEP_TAGS: Mapping[str, str] = {RUNTIME: "runtime", WEIGHTS: "weights", PAGED_KV: "kv_cache", CUDA_GRAPHS: "cudagraph"}
"""The tag of vLLM's sleep allocator whose bytes off the device come off each part."""


@dataclass(frozen=True)
class Breakdown:
    """One engine's parts at its latest sample; ``total`` is the process figure they split (None: unknown)."""

    total_source: str
    total: int | None
    parts: Mapping[str, int]
    """The parts that are known, in ``COMPONENTS`` order."""
    has_paged_kv: bool = False
    """Whether the engine has a paged KV cache (an engine without one is not missing that part)."""
    torch_headroom: int | None = None
    """What vLLM keeps free for torch beside its extensible KV cache: no part of the process, shown beside them."""

    @property
    def complete(self) -> bool:
        """Whether the parts add up to the process figure (``unexplained`` is known)."""
        return UNEXPLAINED in self.parts


def model_local_bytes(snapshot: Snapshot) -> int | None:
    """Bytes the model's own caches hold, each once; None while a declaring owner's caches cannot be observed.

    An observed owner that declares nothing is also a discovered owner (``cache_layer``) with the same
    figures: it counts once, as observed. A declaring owner that discovery finds holding more counts its
    observed caches and, beyond them, what was discovered. An owner two methods found (``cache_layer`` and
    ``census``) counts once, at the larger figure: both see the same memory, as the rules take it."""
    total = 0
    observed: set[str] = set()
    for owner, observation in snapshot.owners().items():
        if observation is None or not observation.available or observation.live_bytes is None:
            if any(d.owner == owner for d in snapshot.declarations):
                return None
            continue
        observed.add(owner)
        total += observation.live_bytes
    found_live: dict[str, int] = {}
    for found in snapshot.discovered:
        if found.owner in observed and not found.declares and found.found_by == DiscoveryMethod.CACHE_LAYER.value:
            continue
        found_live[found.owner] = max(found_live.get(found.owner, 0), found.live_bytes)
    return total + sum(found_live.values())


def resident(snapshot: Snapshot, part: str, figure: int | None) -> int | None:
    """``figure`` less what vLLM's sleep allocator holds off the device under the part's tag (at least 0); None when
    the figure is unknown, or the engine reports a sleep whose books could not be read."""
    sleep = snapshot.sleep
    if figure is None or sleep is None:
        return figure
    if sleep.released is None:
        return None
    return max(0, figure - sleep.released.get(SLEEP_TAGS[part], 0))


def paged_kv_part(snapshot: Snapshot) -> tuple[int | None, bool]:
    """The paged KV cache's bytes on the device at the sample, and whether the engine has one at all.

    An extensible KV cache (one with reserved bytes) is known only from the sample's committed figure: its
    setting is the size of the last commit, which sleep and weight updates release behind it."""
    settings = snapshot.settings
    if settings.paged_kv_reserved_bytes is not None:
        current = snapshot.measured.current
        return (None if current is None else current.values.get("paged_kv_committed")), True
    return resident(snapshot, PAGED_KV, settings.paged_kv_bytes), settings.paged_kv_bytes is not None


def activation_part(snapshot: Snapshot, values: Mapping[str, int]) -> int | None:
    """Torch's free blocks at the sample outside the graph pools, at most the activation allowance; None when any of
    them is unknown (the graph pools' free blocks too, once the engine captured graphs)."""
    reserved, allocated = values.get("torch_reserved"), values.get("torch_allocated")
    allowance = activation_allowance(snapshot)
    settings = snapshot.settings
    graph_free = 0 if settings.cuda_graph_bytes == 0 else settings.cuda_graph_free_bytes
    if allowance is None or reserved is None or allocated is None or graph_free is None:
        return None
    return max(0, min(allowance, reserved - allocated - graph_free))


def activation_allowance(snapshot: Snapshot) -> int | None:
    """The activation allowance: the larger of the activation peak vLLM profiled and planned for and what vLLM 0.34
    keeps free for torch (None: neither)."""
    known = [
        v for v in (snapshot.settings.activation_peak_bytes, snapshot.settings.torch_headroom_bytes) if v is not None
    ]
    return max(known) if known else None


def breakdown(snapshot: Snapshot) -> Breakdown | None:
    """The parts of the engine's latest sample; None before its first sample or when it measures no process figure."""
    current = snapshot.measured.current
    if current is None:
        return None
    values = current.values
    total_source = current.process_source
    device = total_source == "process_gpu"
    if not device and total_source not in values:
        return None
    settings = snapshot.settings
    paged_kv, has_paged_kv = paged_kv_part(snapshot)
    parts: dict[str, int | None] = {
        RUNTIME: resident(snapshot, RUNTIME, settings.runtime_bytes),
        WEIGHTS: resident(snapshot, WEIGHTS, settings.weights_bytes),
        PAGED_KV: paged_kv,
    }
    if device:
        parts[CUDA_GRAPHS] = resident(snapshot, CUDA_GRAPHS, settings.cuda_graph_bytes)
        parts[ACTIVATION_PEAK] = activation_part(snapshot, values)
    parts[MODEL_LOCAL_CACHES] = model_local_bytes(snapshot)
    total = current.process_bytes
    required = [name for name in parts if name != PAGED_KV or has_paged_kv]
    if total is not None and all(parts[name] is not None for name in required):
        parts[UNEXPLAINED] = total - sum(value for value in parts.values() if value is not None)
    known = {name: value for name in COMPONENT_NAMES if (value := parts.get(name)) is not None}
    return Breakdown(total_source, total, known, has_paged_kv, settings.torch_headroom_bytes if device else None)


def part_words(parts: Breakdown) -> list[tuple[str, str]]:
    """Each known part in words: its bytes and its share of the process figure."""
    total = parts.total
    return [
        (name, f"{name} {signed_bytes(value, minus='-')}{f' ({value / total:.0%})' if total else ''}")
        for name, value in parts.parts.items()
    ]


def whole_and_missing(parts: Breakdown) -> tuple[str, str]:
    """The process figure the parts split, and the parts of this kind of engine that are unknown (in words); an
    engine without a paged KV cache is not missing one."""
    whole = (
        f"{parts.total_source} {human_bytes(parts.total)}"
        if parts.total is not None
        else f"{parts.total_source} unknown"
    )
    device = parts.total_source == "process_gpu"
    missing = [
        c.name
        for c in COMPONENTS
        if c.name not in parts.parts and (device or c.host) and (c.name != PAGED_KV or parts.has_paged_kv)
    ]
    return whole, f"; unknown: {', '.join(missing)}" if missing else ""


def headroom_words(parts: Breakdown) -> str:
    """What vLLM keeps free for torch, in words to follow the parts (empty when it keeps nothing known)."""
    if parts.torch_headroom is None:
        return ""
    return f"; vLLM keeps {human_bytes(parts.torch_headroom)} of the device free for torch"


def parts_text(parts: Breakdown) -> str:
    """The parts in one line of words: the process figure, each part with its share, what is unknown, then what vLLM
    keeps free for torch."""
    whole, missing = whole_and_missing(parts)
    words = ", ".join(words for _, words in part_words(parts)) or "none known"
    return f"memory by part of {whole}: {words}{missing}{headroom_words(parts)}"
