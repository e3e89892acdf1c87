"""Where an engine's memory goes: its process figure split into parts (``modelkv_memory_breakdown_bytes``).

Computed from one snapshot's figures, all of one sample, so the engine does no work for it. A device
engine (one that measures torch's caching allocator) splits the device memory NVML attributes to
its process (``process_gpu``); a host engine (a CPU engine, whose weights and caches live in host
memory) splits its resident memory (``process_resident``). Each part is taken from the engine's own
figure where it keeps one and from measurement otherwise; a part that cannot be known is absent,
never 0. ``unexplained`` is the process figure less every other part, present only when every other
part the engine has is known: a rest that silently held an unknown part would explain nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from modelkv_exporter.contract.sizes import human_bytes
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.vocabulary import DiscoveryMethod


@dataclass(frozen=True)
class Component:
    """One part of an engine's memory: its ``component`` label, what it is, where its bytes come from."""

    name: str
    meaning: str
    source: str
    host: bool
    """Whether a host engine has this part too (every part is a device engine's)."""


WEIGHTS = "weights"
PAGED_KV = "paged_kv"
CUDA_GRAPHS = "cuda_graphs"
ACTIVATION_PEAK = "activation_peak"
MODEL_LOCAL_CACHES = "model_local_caches"
NON_TORCH = "non_torch"
UNEXPLAINED = "unexplained"

COMPONENTS: tuple[Component, ...] = (
    Component(
        WEIGHTS,
        "the model's weights",
        "`settings.weights_bytes`: vLLM's `model_runner.model_memory_usage`, else the bytes of the model's "
        "parameters, buffers and computed weights (a legacy `weight_norm`'s or `spectral_norm`'s `weight`) on the "
        "engine's device, each storage once: not `meta` tensors, not weights offloaded to the host (`--cpu-offload-gb`)",
        True,
    ),
    Component(
        PAGED_KV,
        "vLLM's paged KV cache",
        "the bytes an extensible KV cache has committed at the sample (`paged_kv_committed`), else "
        "`settings.paged_kv_bytes`; absent for an engine without a paged KV cache",
        True,
    ),
    Component(
        CUDA_GRAPHS,
        "the CUDA graph pools",
        "`settings.cuda_graph_bytes`: what vLLM's `capture_model` returned (0 for an engine that captures none)",
        False,
    ),
    Component(
        ACTIVATION_PEAK,
        "what torch's caching allocator holds for activations",
        "the activation peak vLLM profiled (`settings.activation_peak_bytes`), at most the free blocks torch's "
        "allocator keeps (`torch_reserved` − `torch_allocated`) and at most what `torch_reserved` holds beyond the "
        "weights, a paged KV cache torch allocates, the graph pools and the model-local caches",
        False,
    ),
    Component(
        MODEL_LOCAL_CACHES,
        "caches the model keeps outside the paged KV cache, each counted once",
        "the live bytes of every observed owner's caches, plus every discovered owner's live bytes (a declaring "
        "owner's: beyond its declared caches) except an observed owner's that discovery repeats; absent while a "
        "declaring owner's caches cannot be observed",
        True,
    ),
    Component(
        NON_TORCH,
        "device memory outside torch's caching allocator and the paged KV cache: the CUDA context, library "
        "workspaces (cuBLAS, NCCL), other allocators",
        "`process_gpu` − `torch_reserved` − `paged_kv_committed`",
        False,
    ),
    Component(
        UNEXPLAINED,
        "the rest: live tensors no other part names (a leak shows here), free blocks torch's allocator keeps "
        "beyond the activation peak; on a host engine also the interpreter, its libraries and activations",
        "the process figure less every other part; present only when all of them are known (a part that is "
        "absent leaves it absent too); negative when the parts count more than the process holds",
        True,
    ),
)
"""Every part, in the order they stack."""

COMPONENT_NAMES: tuple[str, ...] = tuple(c.name for c in COMPONENTS)
TOLERANCE_BYTES = 0
"""How far the parts' sum may be from the process figure: none, each part being of the same sample."""


@dataclass(frozen=True)
class Breakdown:
    """One engine's parts at its latest sample; ``total`` is the process figure they split (None: unknown)."""

    total_source: str
    total: int | None
    parts: Mapping[str, int]
    """The parts that are known, in ``COMPONENTS`` order."""

    @property
    def complete(self) -> bool:
        """Whether the parts add up to the process figure (``unexplained`` is known)."""
        return UNEXPLAINED in self.parts


def model_local_bytes(snapshot: Snapshot) -> int | None:
    """Bytes the model's own caches hold, each once; None while a declaring owner's caches cannot be observed.

    An observed owner that declares nothing is also a discovered owner (``cache_layer``) with the same
    figures: it counts once, as observed. A declaring owner that discovery finds holding more counts its
    observed caches and, beyond them, what was discovered."""
    total = 0
    observed: set[str] = set()
    for owner, observation in snapshot.owners().items():
        if observation is None or not observation.available or observation.live_bytes is None:
            if any(d.owner == owner for d in snapshot.declarations):
                return None
            continue
        observed.add(owner)
        total += observation.live_bytes
    for found in snapshot.discovered:
        if found.owner in observed and not found.declares and found.found_by == DiscoveryMethod.CACHE_LAYER.value:
            continue
        total += found.live_bytes
    return total


def breakdown(snapshot: Snapshot) -> Breakdown | None:
    """The parts of the engine's latest sample; None before its first sample or when it measures no process figure."""
    current = snapshot.measured.current
    if current is None:
        return None
    values = current.values
    device = "torch_reserved" in values or "process_gpu" in values
    total_source = "process_gpu" if device else "process_resident"
    if not device and total_source not in values:
        return None
    settings = snapshot.settings
    committed = values.get("paged_kv_committed")
    paged_kv = committed if committed is not None else settings.paged_kv_bytes
    local = model_local_bytes(snapshot)
    parts: dict[str, int | None] = {WEIGHTS: settings.weights_bytes, PAGED_KV: paged_kv}
    if device:
        reserved = values.get("torch_reserved")
        total = values.get("process_gpu")
        torch_parts = [settings.weights_bytes, settings.cuda_graph_bytes, local]
        torch_parts.append(None if committed is not None else settings.paged_kv_bytes)
        activation = settings.activation_peak_bytes
        if activation is not None and reserved is not None:
            room = reserved - sum(part for part in torch_parts if part is not None)
            free = reserved - values.get("torch_allocated", reserved - room)
            activation = max(0, min(activation, room, free))
        non_torch = None if total is None or reserved is None else total - reserved - (committed or 0)
        parts |= {CUDA_GRAPHS: settings.cuda_graph_bytes, ACTIVATION_PEAK: activation}
        parts |= {MODEL_LOCAL_CACHES: local, NON_TORCH: non_torch}
    else:
        total = values.get("process_resident")
        parts[MODEL_LOCAL_CACHES] = local
    required = [name for name in parts if name != PAGED_KV]
    if total is not None and all(parts[name] is not None for name in required):
        parts[UNEXPLAINED] = total - sum(value for value in parts.values() if value is not None)
    known = {name: value for name in COMPONENT_NAMES if (value := parts.get(name)) is not None}
    return Breakdown(total_source, total, known)


def signed_bytes(value: int) -> str:
    """``human_bytes`` of a figure that may be negative (the rest, when the parts over-count)."""
    return human_bytes(value) if value >= 0 else "-" + human_bytes(-value)


def part_words(parts: Breakdown) -> list[tuple[str, str]]:
    """Each known part in words: its bytes and its share of the process figure."""
    total = parts.total
    return [
        (name, f"{name} {signed_bytes(value)}{f' ({value / total:.0%})' if total else ''}")
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
    missing = [c.name for c in COMPONENTS if c.name not in parts.parts and (device or c.host) and c.name != PAGED_KV]
    return whole, f"; unknown: {', '.join(missing)}" if missing else ""


def parts_text(parts: Breakdown) -> str:
    """The parts in one line of words: the process figure, each part with its share, then what is unknown."""
    whole, missing = whole_and_missing(parts)
    return f"memory by part of {whole}: {', '.join(words for _, words in part_words(parts)) or 'none known'}{missing}"
