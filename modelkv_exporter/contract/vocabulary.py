"""The words engine and sidecar share: cache lifetimes, row drivers, measured-memory sources, drop reasons and
how an undeclared cache was found.

Declarations, snapshots, metric labels, rules and docs all use these values; nothing else
spells them. The words only the sidecar's metrics speak are in ``sidecar.label_values``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ModelLocalKVScope(str, Enum):
    """How long one allocation lives. Diagnostic only: it never scales the bytes."""

    INVOCATION = "invocation"
    """Released when the call returns (a per-step working copy)."""

    REQUEST = "request"
    """Kept across the steps of one request, released when it finishes."""

    SESSION = "session"
    """Outlives a request; belongs to a duplex or streaming session."""

    MODEL = "model"
    """Lives as long as the model (for example captured into a CUDA-graph pool)."""


class RowDriver(str, Enum):
    """What sets how many rows of a cache are live at peak."""

    FIXED = "fixed"
    """A count the model controls (a captured-bucket sum, a serialized call path)."""

    MAX_NUM_SEQS = "max_num_seqs"
    """One row per in-flight sequence; only the engine knows the number."""


SCOPES: frozenset[str] = frozenset(scope.value for scope in ModelLocalKVScope)
ROW_DRIVERS: frozenset[str] = frozenset(driver.value for driver in RowDriver)


@dataclass(frozen=True)
class Measurement:
    """A measured-memory source an engine may report; absent in a snapshot = not measured."""

    source: str
    meaning: str
    baseline: bool


MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement("torch_allocated", "bytes in live tensors of the engine process (torch.cuda.memory_allocated)", True),
    Measurement(
        "torch_reserved", "bytes the engine process's caching allocator holds (torch.cuda.memory_reserved)", True
    ),
    Measurement(
        "torch_peak_allocated", "peak bytes in live tensors since start (torch.cuda.max_memory_allocated)", False
    ),
    Measurement(
        "device_used", "bytes in use on the whole device, every process (total - free from cudaMemGetInfo)", True
    ),
    Measurement("device_total", "total bytes of the device (cudaMemGetInfo)", False),
    Measurement("process_gpu", "GPU bytes NVML attributes to the engine process", True),
    Measurement("process_resident", "resident host memory of the engine process (a CPU engine's device memory)", True),
    Measurement(
        "torch_allocated_high_water",
        "highest bytes in live tensors over the last two minutes of samples (torch.cuda.max_memory_allocated, its "
        "peak reset after each sample once the engine initialised); its baseline adds the activation peak vLLM "
        "profiled to the live tensors after initialisation",
        True,
    ),
    Measurement(
        "torch_allocated_low_water",
        "lowest bytes in live tensors over the last two minutes of samples (torch.cuda.memory_allocated at each "
        "sample): the memory live between engine steps, activations a busy engine holds mid-step only where every "
        "sample of the window fell inside a step; its baseline is torch_allocated's",
        False,
    ),
    Measurement(
        "paged_kv_committed",
        "bytes of the paged KV cache mapped on the device at the sample, outside torch's caching allocator (vLLM "
        "0.34's extensible KV cache: ExtensibleKVCache.physical_bytes; 0 while released for sleep or a weight "
        "update); absent for a paged KV cache torch allocates",
        True,
    ),
)


class DropReason(str, Enum):
    """Why an engine could not publish a declaration its model makes."""

    DECLARER_RAISED = "declarer_raised"
    """The owner's ``model_local_kv_specs()`` raised: how many specs it would have declared is unknown."""

    UNRESOLVABLE_SPEC = "unresolvable_spec"
    """A spec the owner returned could not be resolved (a missing or malformed field)."""


class EndReason(str, Enum):
    """Why an engine's snapshot ended (``Snapshot.end.reason``); readers accept any plain name."""

    SHUTDOWN = "shutdown"
    """The worker shut down, was dropped by its engine, or its process exited normally."""

    OUT_OF_MEMORY = "out_of_memory"
    """The worker raised an out-of-memory error (torch's, or the driver's where vLLM maps its KV cache itself)."""

    ERROR = "error"
    """The worker raised another exception that ended its engine."""

    VANISHED = "vanished"
    """Told by the sidecar, never written: the process is gone (killed: SIGKILL, the kernel's OOM killer) without
    ending its snapshot, as its liveness lock says (``contract.spool.writer_alive``)."""


class DiscoveryMethod(str, Enum):
    """How the engine found memory a module holds without declaring it."""

    CACHE_LAYER = "cache_layer"
    """A ``transformers`` cache layer created, copied or first used while no declaring owner ran."""

    CENSUS = "census"
    """Tensors reachable from the module that it did not hold after initialisation (a cache of its own)."""
