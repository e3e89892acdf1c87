"""What the observer knows about ``transformers`` cache layer classes, and how it weighs one layer.

Bytes are the ``nbytes`` of each distinct *storage* behind a layer's key and value tensors, not
``numel * element_size``: a ``DynamicSlidingWindowLayer`` keeps a ``window - 1`` view into the
tensor ``torch.cat`` just made, and the whole storage stays allocated; ``copy.deepcopy`` copies
whole storages too.

Classes are recognised by name within ``transformers.cache_utils`` and checked by behaviour when
the observer installs (``probe``), not by a version pin. A subclass from elsewhere is read the way
its vetted base is read, but checked for tensors in attributes that base does not have.
"""

from __future__ import annotations

from typing import Any

import torch

VETTED_MODULE = "transformers.cache_utils"
VETTED_KV_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "DynamicLayer": ("keys", "values"),
    "DynamicSlidingWindowLayer": ("keys", "values"),
    "StaticLayer": ("keys", "values"),
    "StaticSlidingWindowLayer": ("keys", "values"),
    "DynamicIndexedLayer": ("keys", "values", "indexer_keys"),
    "StaticIndexedLayer": ("keys", "values", "indexer_keys"),
    "LinearAttentionAndFullAttentionLayer": ("keys", "values"),
    "LinearAttentionAndSlidingWindowAttentionLayer": ("keys", "values"),
    "LinearAttentionAndStaticFullAttentionLayer": ("keys", "values"),
    "LinearAttentionAndStaticSlidingWindowAttentionLayer": ("keys", "values"),
}
"""Layer classes whose attributes were read in transformers 5.14 and 5.19, with the attributes holding KV.

Hybrid layers count only their attention keys and values: convolution and recurrent states are not KV.
"""
OPAQUE_LAYERS = frozenset({"QuantizedLayer", "QuantoQuantizedLayer", "HQQQuantizedLayer"})
"""Layer classes whose payload is quantized: their exact bytes cannot be read from plain tensors."""
BOOKKEEPING_ATTRIBUTES = frozenset(
    {"cumulative_length", "_sliding_window_tensor", "indexer_cumulative_length", "conv_states", "recurrent_states"}
)
"""Per-layer attributes that may hold tensors but are not KV."""
FRESH_AFTER_UPDATE = frozenset({"DynamicLayer", "DynamicSlidingWindowLayer"})
"""Classes whose every hooked method leaves keys and values that ``torch.cat`` (or ``torch.tensor``) just made,
or a window view into one: their bytes are the sizes of those tensors, or of the view's base, read without
building storage objects (the hot path's largest cost). Copies and changes outside the hooked methods are
weighed by storage (``settle``, every sample)."""
HOOKED_METHODS = ("update", "lazy_initialization", "update_indexer", "lazy_initialization_indexer")
"""Layer methods after which a layer is re-measured, wherever a class defines them."""

StorageKey = tuple[str, int]


class Plan:
    """How to weigh one layer class: which attributes hold KV, or why it cannot be weighed."""

    __slots__ = ("attributes", "keys_and_values", "vetted", "unknown", "static", "fresh")

    def __init__(
        self, attributes: tuple[str, ...], vetted: bool, unknown: str | None, static: bool = False, fresh: bool = False
    ) -> None:
        self.attributes = attributes
        self.keys_and_values = attributes == ("keys", "values")
        self.vetted = vetted
        self.unknown = unknown
        self.static = static and self.keys_and_values
        """Preallocated in place (the StaticLayer family): its bytes change only when its tensor objects do."""
        self.fresh = fresh and vetted and self.keys_and_values
        """One of ``FRESH_AFTER_UPDATE``, exactly."""


_plans: dict[type, Plan] = {}


def forget_plans() -> None:
    """Drop every cached plan (when the observer is removed)."""
    _plans.clear()


def plan_for(cls: type) -> Plan:
    """How to weigh layers of ``cls``, decided once per class."""
    plan = _plans.get(cls)
    if plan is not None:
        return plan
    for klass in cls.__mro__:
        if klass.__module__ != VETTED_MODULE:
            continue
        if klass.__name__ in OPAQUE_LAYERS:
            plan = Plan((), False, f"{cls.__qualname__} keeps quantized payloads; exact bytes are not readable")
            break
        if klass.__name__ in VETTED_KV_ATTRIBUTES:
            static = any(k.__module__ == VETTED_MODULE and k.__name__ == "StaticLayer" for k in cls.__mro__)
            fresh = klass.__name__ in FRESH_AFTER_UPDATE
            plan = Plan(VETTED_KV_ATTRIBUTES[klass.__name__], klass is cls, None, static and klass is cls, fresh)
            break
    else:
        plan = Plan((), False, f"cache layer class {cls.__module__}.{cls.__qualname__} is not understood")
    _plans[cls] = plan
    return plan


def kv_bytes(layer: Any) -> int:
    """Storage bytes of ``layer.keys`` plus ``layer.values``: the hot path for vetted classes.

    Vetted layers allocate keys and values separately, so only the same object twice is
    de-duplicated here; a sample's recount de-duplicates by storage.
    """
    attributes = layer.__dict__
    keys = attributes.get("keys")
    values = attributes.get("values")
    size: int = 0 if keys is None else keys.untyped_storage().nbytes()
    if values is None or values is keys:
        return size
    return size + values.untyped_storage().nbytes()


def storages(layer: Any, attributes: tuple[str, ...]) -> dict[StorageKey, int]:
    """``{(device, data pointer): nbytes}`` of the storages behind ``attributes`` (an empty storage keyed by id)."""
    found: dict[StorageKey, int] = {}
    state = layer.__dict__
    for name in attributes:
        tensor = state.get(name)
        if tensor is None:
            continue
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        found[(str(storage.device), pointer if pointer else -id(tensor))] = int(storage.nbytes())
    return found


def measure(layer: Any, plan: Plan) -> int:
    """Bytes of one layer by its plan."""
    if plan.keys_and_values:
        return kv_bytes(layer)
    return sum(storages(layer, plan.attributes).values())


def _holds_tensor(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(isinstance(item, torch.Tensor) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(isinstance(item, torch.Tensor) for item in value)
    return False


def unexpected_tensors(layer: Any, plan: Plan) -> list[str]:
    """Attributes of ``layer`` holding tensors that are neither its plan's KV nor known bookkeeping."""
    found = []
    for name, value in vars(layer).items():
        if name in plan.attributes or name in BOOKKEEPING_ATTRIBUTES:
            continue
        if isinstance(value, torch.Tensor) and value.dim() == 0:
            continue
        if _holds_tensor(value):
            found.append(name)
    return found


def structure_problem(layer: Any, plan: Plan) -> str | None:
    """Why a layer of a provisional class cannot be weighed (tensors its plan would miss), or None."""
    extra = unexpected_tensors(layer, plan)
    return f"{type(layer).__qualname__} holds tensors in {extra} that are not understood" if extra else None
