"""What to give vLLM so that an engine fits its memory: the KV cache bytes (``--kv-cache-memory-bytes``), the
equivalent ``--gpu-memory-utilization``, and for vLLM 0.34's extensible KV cache the headroom to keep free.

One definition, computed from one snapshot (``plan``, the landing page, ``/api/v1/engines`` and
``modelkv_engine_prescribed_kv_cache_bytes`` all read it):

- the requested memory: the memory the engine sizes itself to, ``settings.requested_memory_bytes`` (vLLM's
  ``requested_memory``), else the device's total (``device_total``) times ``gpu_memory_utilization``;
- what the engine needs besides its paged KV cache: every part of its memory breakdown
  (``sidecar.breakdown``) as measured at the sample (the runtime, the weights, the CUDA graph pools and
  ``unexplained``: memory made outside torch, torch's free blocks beyond the activation allowance, anything
  no part names) with two parts taken at their peak instead of their sample: the activations at the
  activation allowance (the larger of the peak vLLM profiled and what vLLM 0.34 keeps free for torch) and
  the model-local caches at the engine's max_num_seqs, the larger of declared and observed
  (``Demand.expected``) or what they hold now where that is more;
- the margin: ``PRESCRIPTION_MARGIN_RATIO`` of the requested memory;
- the KV cache to give vLLM: the requested memory less the needs less the margin; against what vLLM chose at
  start-up (``settings.paged_kv_bytes``), the signed difference (negative: vLLM gave its KV cache more
  than the engine can spare);
- the equivalent ``--gpu-memory-utilization``: the one at which vLLM, whose own estimate of the rest
  (the requested memory less what it chose) is unchanged, would choose that KV cache;
- an extensible KV cache (vLLM 0.34): the headroom vLLM should keep free beside it, what it kept
  (``settings.torch_headroom_bytes``) plus what the cache must give up;
- where vLLM's start-up estimate was off: the activation peak measured since (the high water less the
  floor of live tensors in the last two minutes) against the one it profiled, and the memory outside torch
  grown since the baseline (``Growth.non_torch``).

A figure that cannot be computed is None with the reason in words, never 0. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from modelkv_exporter.contract.sizes import human_bytes, signed_bytes
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.thresholds import PRESCRIPTION_MARGIN_RATIO
from modelkv_exporter.sidecar.breakdown import (
    ACTIVATION_PEAK,
    MODEL_LOCAL_CACHES,
    PAGED_KV,
    UNEXPLAINED,
    activation_allowance,
    breakdown,
    whole_and_missing,
)
from modelkv_exporter.sidecar.capacity import Demand
from modelkv_exporter.sidecar.growth import growth

FLAG = "--kv-cache-memory-bytes"
UTILIZATION_FLAG = "--gpu-memory-utilization"
PRESCRIPTION_LEGEND = (
    "the requested memory less what the engine was measured to need besides its paged KV cache, with its "
    "activations at their allowance and its model-local caches at their peak, less the margin; docs/prescription.md"
)
"""How the prescription is computed, in one sentence for ``plan`` and the page."""


@dataclass(frozen=True)
class RequestedMemory:
    """The memory the engine sizes itself to (vLLM's requested memory), and where that figure comes from (None:
    unknown, ``source`` says why)."""

    bytes: int | None
    source: str


@dataclass(frozen=True)
class Prescription:
    """One engine's prescription; each figure None when it cannot be computed (its reason then says why)."""

    requested: RequestedMemory
    needs: Mapping[str, int]
    """What the engine needs besides its paged KV cache, by breakdown part (empty when any part is unknown)."""
    margin: int | None
    kv_cache_bytes: int | None
    """The KV cache memory to give vLLM (``--kv-cache-memory-bytes``); negative: even no KV cache does not fit."""
    reason: str | None
    """Why ``kv_cache_bytes`` is None."""
    chosen_kv_bytes: int | None
    """What vLLM chose at start-up (``settings.paged_kv_bytes``); None for an engine without a paged KV cache."""
    gpu_memory_utilization: float | None
    """The equivalent ``--gpu-memory-utilization`` (None: ``utilization_reason``)."""
    utilization_reason: str | None
    headroom_bytes: int | None = None
    """An extensible KV cache: the bytes vLLM should keep free beside it (None otherwise)."""
    kept_headroom_bytes: int | None = None
    """What vLLM kept free beside it (``settings.torch_headroom_bytes``)."""
    activation_off: int | None = None
    """The activation peak measured since start-up less the one vLLM profiled (None: either unknown)."""
    non_torch_off: int | None = None
    """Memory outside torch grown since the baseline: what vLLM's start-up profile did not see (None: unknown)."""

    @property
    def needed_bytes(self) -> int | None:
        """The needs summed (None when unknown)."""
        return sum(self.needs.values()) if self.needs else None

    @property
    def difference(self) -> int | None:
        """The prescription less what vLLM chose (negative: give the KV cache less)."""
        if self.kv_cache_bytes is None or self.chosen_kv_bytes is None:
            return None
        return self.kv_cache_bytes - self.chosen_kv_bytes

    @property
    def flag(self) -> str | None:
        """The flag to paste (None without a prescription, or when no KV cache fits)."""
        if self.kv_cache_bytes is None or self.kv_cache_bytes <= 0:
            return None
        return f"{FLAG}={self.kv_cache_bytes}"


def requested_memory(snapshot: Snapshot) -> RequestedMemory:
    """The engine's requested memory: vLLM's figure, else the device's total times gpu_memory_utilization."""
    settings = snapshot.settings
    if settings.requested_memory_bytes is not None:
        return RequestedMemory(settings.requested_memory_bytes, "requested_memory_bytes")
    current = snapshot.measured.current
    total = None if current is None else current.values.get("device_total")
    if total is None:
        return RequestedMemory(
            None, "no total memory: the engine reports neither its requested memory nor its device's total"
        )
    if settings.gpu_memory_utilization is None:
        return RequestedMemory(None, "no gpu_memory_utilization: the engine's share of its device is unknown")
    return RequestedMemory(math.floor(total * settings.gpu_memory_utilization), "device_total × gpu_memory_utilization")


def needs_of(snapshot: Snapshot) -> tuple[dict[str, int], str | None]:
    """What the engine needs besides its paged KV cache, by part, or no parts and the reason."""
    if snapshot.sleep is not None and snapshot.sleep.level > 0:
        return {}, f"asleep (level {snapshot.sleep.level}): its figures are not those it serves with"
    parts = breakdown(snapshot)
    if parts is None:
        return {}, "no measured memory: the engine has published no sample of its process figure"
    if not parts.complete:
        _, missing = whole_and_missing(parts)
        return {}, f"a part of its memory is not measured{missing or ': its process figure'}"
    needs = {name: value for name, value in parts.parts.items() if name not in (PAGED_KV, ACTIVATION_PEAK)}
    if ACTIVATION_PEAK in parts.parts:
        allowance = activation_allowance(snapshot)
        if allowance is None:
            return {}, "no activation peak: vLLM's profiled peak is unknown"
        needs[ACTIVATION_PEAK] = max(allowance, parts.parts[ACTIVATION_PEAK])
    peak = Demand.expected(snapshot).peak_at(snapshot.settings.max_num_seqs or 1)
    needs[MODEL_LOCAL_CACHES] = max(peak, parts.parts[MODEL_LOCAL_CACHES])
    needs[UNEXPLAINED] = parts.parts[UNEXPLAINED]
    return needs, None


def measured_activation(values: Mapping[str, int]) -> int | None:
    """The activation peak of the last two minutes: the high water of live tensors above their floor."""
    high, low = values.get("torch_allocated_high_water"), values.get("torch_allocated_low_water")
    return None if high is None or low is None else max(0, high - low)


def prescription(snapshot: Snapshot) -> Prescription:
    """The engine's prescription from its snapshot."""
    settings = snapshot.settings
    requested = requested_memory(snapshot)
    needs, reason = needs_of(snapshot)
    margin = None if requested.bytes is None else math.ceil(requested.bytes * PRESCRIPTION_MARGIN_RATIO)
    kv: int | None = None
    if requested.bytes is None:
        reason = requested.source
    elif reason is None and margin is not None:
        kv = requested.bytes - sum(needs.values()) - margin
    chosen = settings.paged_kv_bytes
    utilization, utilization_reason = _utilization(settings.gpu_memory_utilization, requested.bytes, chosen, kv)
    headroom = kept = None
    if settings.paged_kv_reserved_bytes is not None and settings.torch_headroom_bytes is not None:
        kept = settings.torch_headroom_bytes
        if kv is not None and chosen is not None:
            headroom = kept + chosen - kv
    current = snapshot.measured.current
    measured = None if current is None else measured_activation(current.values)
    profiled = settings.activation_peak_bytes
    grown = growth(snapshot)
    return Prescription(
        requested=requested,
        needs=needs,
        margin=margin,
        kv_cache_bytes=kv,
        reason=reason if kv is None else None,
        chosen_kv_bytes=chosen,
        gpu_memory_utilization=utilization,
        utilization_reason=utilization_reason,
        headroom_bytes=headroom,
        kept_headroom_bytes=kept,
        activation_off=None if measured is None or profiled is None else measured - profiled,
        non_torch_off=None if grown is None else grown.non_torch,
    )


def _utilization(
    share: float | None, requested: int | None, chosen: int | None, kv: int | None
) -> tuple[float | None, str | None]:
    """The gpu_memory_utilization at which vLLM, its estimate of the rest unchanged, chooses ``kv``."""
    if kv is None:
        return None, "no prescription"
    if share is None:
        return None, "no gpu_memory_utilization: the engine's share of its device is unknown"
    if chosen is None:
        return None, "no paged KV cache chosen by vLLM to compare with"
    assert requested is not None
    equivalent = share * (requested - chosen + kv) / requested
    if equivalent > 1:
        return None, f"above 1 ({equivalent:.4f}): no share of the device gives it; use {FLAG}"
    if equivalent <= 0:
        return None, f"not above 0 ({equivalent:.4f}): no share of the device gives it"
    return equivalent, None


def prescription_text(found: Prescription) -> str:
    """The prescription in one line of words."""
    if found.kv_cache_bytes is None:
        return f"no prescription: {found.reason}"
    needed = found.needed_bytes
    assert found.margin is not None and found.requested.bytes is not None and needed is not None
    words = [
        f"KV cache to give vLLM {human_bytes(found.kv_cache_bytes)}"
        if found.flag
        else f"nothing left for a KV cache ({signed_bytes(found.kv_cache_bytes, minus='-')})",
        f"requested memory {human_bytes(found.requested.bytes)} less needs {signed_bytes(needed, minus='-')} "
        f"less margin {human_bytes(found.margin)} ({PRESCRIPTION_MARGIN_RATIO:.0%})",
    ]
    if found.difference is not None and found.chosen_kv_bytes is not None:
        words.append(
            f"vLLM chose {human_bytes(found.chosen_kv_bytes)} ({signed_bytes(found.difference, plus='+', minus='-')} to change)"
        )
    if found.gpu_memory_utilization is not None:
        words.append(f"or {UTILIZATION_FLAG}={found.gpu_memory_utilization:.4f}")
    if found.headroom_bytes is not None and found.kept_headroom_bytes is not None:
        words.append(
            f"extensible KV cache: keep {human_bytes(found.headroom_bytes)} free beside it "
            f"(vLLM keeps {human_bytes(found.kept_headroom_bytes)})"
        )
    return "; ".join(words)


def estimate_text(found: Prescription) -> str:
    """Where vLLM's start-up estimate was off, in words (empty when nothing is known)."""
    words = []
    if found.activation_off is not None:
        words.append(
            f"activation peak measured {signed_bytes(found.activation_off, plus='+', minus='-')} against vLLM's profile"
        )
    if found.non_torch_off is not None:
        words.append(f"memory outside torch {signed_bytes(found.non_torch_off, plus='+', minus='-')} since start-up")
    return "; ".join(words)
