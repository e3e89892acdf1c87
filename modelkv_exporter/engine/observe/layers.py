"""What the observer knows about ``transformers`` cache layer classes, and how it weighs one layer.

Bytes are the ``nbytes`` of each distinct *storage* behind a layer's key and value tensors, not
``numel * element_size``: a ``DynamicSlidingWindowLayer`` keeps a ``window - 1`` view into the
tensor ``torch.cat`` just made, and the whole storage stays allocated; ``copy.deepcopy`` copies
whole storages too.

Classes are recognised by name within ``transformers.cache_utils`` and checked by behaviour when
the observer installs (``transformers_check``), not by a version pin. A layer class from elsewhere (a subclass of a vetted
class, or a hand-made ``CacheLayerMixin`` subclass) is weighed by every tensor its instance dict holds (keys and
values, scales, a backing buffer; in lists, tuples and dicts there too), by storage, so a storage shared between
them counts once: one rule whether its owner declares it or not. Known bookkeeping and 0-dimension tensors are
not KV.

Reading runs none of the model's code: a layer's state through the instance-dict descriptor of the
first class that has one (not ``layer.__dict__``, which a subclass may make a property), types with ``type()``
and ``issubclass`` (``isinstance`` may read ``__class__``). Plain tensors (exactly ``torch.Tensor``, no
``__torch_function__`` mode on) are read directly; any other tensor by the engine's weigher
(``engine.tensors``: storages, no ``__torch_function__``, no ``__torch_dispatch__``, a wrapper subclass through its
inner tensors). A tensor it cannot read makes the layer ``Unweighable``: its owner's figure is unknown, observation
goes on. A meta tensor is no memory: it weighs 0.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from modelkv_exporter.engine.tensors import StorageKey, dispatches_to_python, is_tensor, weigh

VETTED_MODULE = "transformers.cache_utils"
VETTED_KV_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "DynamicLayer": ("keys", "values"),
    "DynamicSlidingWindowLayer": ("keys", "values"),
    "StaticLayer": ("keys", "values"),
    "StaticSlidingWindowLayer": ("keys", "values"),
    "SlidingWindowLayer": ("keys", "values"),
    "ChunkedSlidingLayer": ("keys", "values"),
    "DynamicIndexedLayer": ("keys", "values", "indexer_keys"),
    "StaticIndexedLayer": ("keys", "values", "indexer_keys"),
    "LinearAttentionAndFullAttentionLayer": ("keys", "values"),
    "LinearAttentionAndSlidingWindowAttentionLayer": ("keys", "values"),
    "LinearAttentionAndStaticFullAttentionLayer": ("keys", "values"),
    "LinearAttentionAndStaticSlidingWindowAttentionLayer": ("keys", "values"),
}
"""Layer classes whose attributes were read in transformers 4.56, 5.14, 5.19 and 5.25, with the attributes holding KV.

``SlidingWindowLayer`` and ``ChunkedSlidingLayer`` are 4.56's static sliding layers (``StaticSlidingWindowLayer``
from 5.0).

Hybrid layers count only their attention keys and values: convolution and recurrent states are not KV.
"""
OPAQUE_LAYERS = frozenset({"BaseQuantizedLayer", "QuantizedLayer", "QuantoQuantizedLayer", "HQQQuantizedLayer"})
"""Layer classes whose payload is quantized: their exact bytes cannot be read from plain tensors."""
BOOKKEEPING_ATTRIBUTES = frozenset(
    {"cumulative_length", "_sliding_window_tensor", "indexer_cumulative_length", "conv_states", "recurrent_states"}
)
"""Per-layer attributes that may hold tensors but are not KV."""
FRESH_AFTER_UPDATE = frozenset({"DynamicLayer", "DynamicSlidingWindowLayer"})
"""Classes whose every hooked method leaves keys and values that ``torch.cat`` (or ``torch.tensor``) just made,
or a window view into one: their bytes are the sizes of those tensors, or of the view's base, read without
building storage objects (the hot path's largest cost). Copies and changes outside the hooked methods are
weighed by storage (``tally.refresh``, at each sample)."""
MIXIN = "CacheLayerMixin"
"""The base of every layer class: a hand-made subclass of it is weighed by every tensor it holds."""
HOOKED_METHODS = ("update", "lazy_initialization", "update_indexer", "lazy_initialization_indexer")
"""Layer methods after which a layer is re-measured, wherever a class defines them."""


class Plan:
    """How to weigh one layer class: which attributes hold KV, or why it cannot be weighed."""

    __slots__ = ("attributes", "keys_and_values", "vetted", "unknown", "static", "fresh", "state", "every")

    def __init__(
        self,
        attributes: tuple[str, ...],
        vetted: bool,
        unknown: str | None,
        static: bool = False,
        fresh: bool = False,
        state: Callable[[Any], dict[str, Any]] = vars,
        every: bool = False,
    ) -> None:
        self.attributes = attributes
        self.state = state
        """A layer's instance dict, read through the real descriptor (never a property of the layer's class)."""
        self.every = every
        """A layer class from outside ``transformers.cache_utils``: every tensor of its instance dict is weighed
        (``kv_names``), not only ``attributes``."""
        self.keys_and_values = attributes == ("keys", "values") and not every
        self.vetted = vetted
        self.unknown = unknown
        self.static = static and self.keys_and_values
        """Preallocated in place (the StaticLayer family): its bytes change only when its tensor objects do."""
        self.fresh = fresh and vetted and self.keys_and_values
        """One of ``FRESH_AFTER_UPDATE``, exactly, whose ``__dict__`` runs no code (``plain_attributes``); vetted, so
        never ``unknown``: an update of its layers takes the hooks' fast path."""


_plans: dict[type, Plan] = {}


def forget_plans() -> None:
    """Drop every cached plan (when the observer is removed)."""
    _plans.clear()
    _holds_no_tensor.clear()


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
            fresh = klass.__name__ in FRESH_AFTER_UPDATE and plain_attributes(cls)
            vetted = klass is cls
            attributes = VETTED_KV_ATTRIBUTES[klass.__name__]
            plan = Plan(attributes, vetted, None, static and vetted, fresh, every=not vetted)
            break
        if klass.__name__ == MIXIN:
            plan = Plan(("keys", "values"), False, None, every=True)
            break
    else:
        plan = Plan((), False, f"cache layer class {cls.__module__}.{cls.__qualname__} is not understood")
    state = instance_dict(cls)
    if state is None:
        plan.unknown = plan.unknown or f"{cls.__qualname__} keeps no instance __dict__"
    else:
        plan.state = state
    _plans[cls] = plan
    return plan


def instance_dict(cls: type) -> Callable[[Any], dict[str, Any]] | None:
    """The getter of the real instance dict of ``cls``'s objects: the ``__dict__`` slot descriptor of the first class
    in its MRO that has one, skipping whatever a class put in its place. None: its objects have no dict."""
    for klass in type.__dict__["__mro__"].__get__(cls):
        descriptor = type.__dict__["__dict__"].__get__(klass).get("__dict__")
        if type(descriptor) is types.GetSetDescriptorType and descriptor.__objclass__ is klass:
            return descriptor.__get__  # type: ignore[no-any-return]
    return None


def plain_attributes(cls: type) -> bool:
    """Whether ``obj.__dict__`` on an object of ``cls`` runs no code of its classes: no ``__getattribute__`` but
    ``object``'s, and the first ``__dict__`` in its MRO the real descriptor (what ``instance_dict`` returns)."""
    dicts = [type.__dict__["__dict__"].__get__(klass) for klass in type.__dict__["__mro__"].__get__(cls)]
    getattribute = next(found["__getattribute__"] for found in dicts if "__getattribute__" in found)
    descriptor = next((found["__dict__"] for found in dicts if "__dict__" in found), None)
    state = instance_dict(cls)
    plain_dict = type(descriptor) is types.GetSetDescriptorType and descriptor.__get__ == state
    return getattribute is object.__dict__["__getattribute__"] and plain_dict


_Tensor = torch.Tensor
_modes_on = torch._C._is_torch_function_mode_enabled
_no_torch_function = torch._C.DisableTorchFunction
_dim_of = torch._C.TensorBase.dim
_get = dict.get


class Unweighable(Exception):
    """A layer holds something in a KV attribute whose bytes cannot be read (not a tensor, no storage)."""


def _weigh(tensor: Any, out: dict[StorageKey, int]) -> None:
    """Add ``tensor``'s storages to ``out`` (``engine.tensors.weigh``); a None adds nothing."""
    if tensor is None:
        return
    if not is_tensor(tensor):
        raise Unweighable(f"a cache layer holds a {type(tensor).__name__} where a tensor belongs")
    if not weigh(tensor, out, empty=True):
        raise Unweighable(
            f"a cache tensor of type {type(tensor).__qualname__} has no storage that can be read without its code"
        )


def _bytes_of(tensor: Any) -> int:
    found: dict[StorageKey, int] = {}
    _weigh(tensor, found)
    return sum(found.values())


def pair_bytes(keys: Any, values: Any) -> int:
    """Storage bytes of a keys and values pair; the same object twice counts once (a sample's recount
    de-duplicates by storage)."""
    if type(keys) is _Tensor and type(values) is _Tensor and not _modes_on():
        size: int = 0 if keys.is_meta else keys.untyped_storage().nbytes()
        if values is not keys:
            size += 0 if values.is_meta else values.untyped_storage().nbytes()
        return size
    size = _bytes_of(keys)
    return size if values is keys else size + _bytes_of(values)


def same_tensors(keys: Any, values: Any) -> tuple[Callable[[], Any] | None, Callable[[], Any]]:
    """Weak references to the tensors just measured (a static layer is re-measured only when they change)."""
    if keys is None or values is None:
        return None, _nothing
    return weakref.ref(keys), weakref.ref(values)


def _nothing() -> None:
    return None


def _is_kv_tensor(value: Any) -> bool:
    """A tensor that may hold KV: any but a 0-dimension plain one (a counter, a length)."""
    if not is_tensor(value):
        return False
    if dispatches_to_python(value):
        return True
    with _no_torch_function():
        return bool(_dim_of(value) != 0)


_holds_no_tensor: dict[type, bool] = {}
"""Per type of an attribute's value: True when no value of it is a tensor or a container of tensors (told once a
type: ``issubclass`` against ``torch.Tensor`` costs a microsecond on the hot path)."""


def _held_tensors(value: object) -> list[Any]:
    """The KV tensors in one attribute's value: the tensor itself, or those in a list, tuple or dict."""
    kind = type(value)
    plain = _holds_no_tensor.get(kind)
    if plain is None:
        plain = _holds_no_tensor[kind] = not (
            issubclass(kind, _Tensor) or kind is dict or kind is list or kind is tuple
        )
    if plain:
        return []
    if kind is dict:
        items: Any = dict.values(value)  # type: ignore[arg-type]
    elif kind is list or kind is tuple:
        items = value
    else:
        items = (value,)
    return [item for item in items if _is_kv_tensor(item)]


def kv_names(values: dict[str, Any], plan: Plan) -> tuple[str, ...]:
    """The attributes of a layer (its instance dict ``values``) weighed by ``plan``: its KV attributes, and for a
    class from elsewhere every other attribute holding a tensor that is not known bookkeeping."""
    if not plan.every:
        return plan.attributes
    extra = tuple(
        name
        for name, value in dict.items(values)
        if name not in plan.attributes and name not in BOOKKEEPING_ATTRIBUTES and _held_tensors(value)
    )
    return plan.attributes + extra


def storages(layer: Any, plan: Plan) -> dict[StorageKey, int]:
    """``{(device, data pointer): nbytes}`` of the storages behind every attribute ``plan`` weighs (``kv_names``), each
    distinct storage once (a meta or empty storage at 0, keyed by its tensor's id: its device still counts). Raises
    ``Unweighable`` where a tensor cannot be read."""
    found: dict[StorageKey, int] = {}
    values = plan.state(layer)
    for name in kv_names(values, plan):
        _weigh_value(_get(values, name), found)
    return found


def _weigh_value(value: object, found: dict[StorageKey, int]) -> None:
    """A KV attribute's storages: a tensor (or None), or the tensors in a list, tuple or dict."""
    kind = type(value)
    if kind is dict or kind is list or kind is tuple:
        for tensor in _held_tensors(value):
            _weigh(tensor, found)
        return
    _weigh(value, found)


def readable_storages(layer: Any, plan: Plan) -> dict[StorageKey, int]:
    """``storages`` of what can be read of ``layer`` (a tensor that cannot be read adds nothing); raises nothing."""
    found: dict[StorageKey, int] = {}
    if plan.unknown is not None:
        return found
    try:
        values = plan.state(layer)
        names = kv_names(values, plan)
    except Exception:
        return found
    for name in names:
        for tensor in _held_tensors(_get(values, name)):
            weigh(tensor, found, empty=True)
    return found


def held_storages(layer: Any, plan: Plan) -> dict[StorageKey, int]:
    """``readable_storages``, and the storages of the layer's bookkeeping tensors (a static layer's
    ``cumulative_length``): everything the layer holds, which no census should report as another module's."""
    found = readable_storages(layer, plan)
    if plan.unknown is not None:
        return found
    try:
        values = plan.state(layer)
    except Exception:
        return found
    for name in BOOKKEEPING_ATTRIBUTES:
        value = _get(values, name)
        if is_tensor(value):
            weigh(value, found, empty=True)
    return found


def tensors(layer: Any, plan: Plan) -> tuple[Any, ...]:
    """The objects in ``layer``'s KV attributes."""
    state = plan.state(layer)
    return tuple(_get(state, name) for name in kv_names(state, plan))


def measure(layer: Any, plan: Plan, shared: tuple[Any, ...] = ()) -> int:
    """Bytes of one layer by its plan, leaving out the tensor objects in ``shared`` (counted elsewhere)."""
    state = plan.state(layer)
    if shared:
        size, seen = 0, list(shared)
        for name in kv_names(state, plan):
            tensor = _get(state, name)
            if tensor is not None and not any(tensor is other for other in seen):
                seen.append(tensor)
                size += _bytes_of(tensor) if is_tensor(tensor) else sum(map(_bytes_of, _held_tensors(tensor)))
        return size
    if plan.keys_and_values or (plan.every and kv_names(state, plan) == ("keys", "values")):
        return pair_bytes(_get(state, "keys"), _get(state, "values"))
    return sum(storages(layer, plan).values())


def kv_bytes(layer: Any) -> int:
    """Storage bytes of a vetted layer's keys plus values (the same object twice counts once)."""
    return measure(layer, plan_for(type(layer)))


def _holds_tensor(value: object) -> bool:
    kind = type(value)
    if issubclass(kind, _Tensor):
        return True
    if kind is dict:
        return any(is_tensor(item) for item in dict.values(value))  # type: ignore[arg-type,var-annotated]
    if kind is list or kind is tuple:
        return any(is_tensor(item) for item in value)  # type: ignore[attr-defined]
    return False


def unexpected_tensors(layer: Any, plan: Plan) -> list[str]:
    """Attributes of ``layer`` holding tensors that are neither its plan's KV nor known bookkeeping (none for a plan
    that weighs every tensor)."""
    found: list[str] = []
    if plan.every:
        return found
    for name, value in dict.items(plan.state(layer)):
        if name in plan.attributes or name in BOOKKEEPING_ATTRIBUTES:
            continue
        if is_tensor(value) and not dispatches_to_python(value):
            with _no_torch_function():
                if _dim_of(value) == 0:
                    continue
        if _holds_tensor(value):
            found.append(name)
    return found


def structure_problem(layer: Any, plan: Plan) -> str | None:
    """Why a layer of a provisional class cannot be weighed (tensors its plan would miss), or None."""
    extra = unexpected_tensors(layer, plan)
    return f"{type(layer).__qualname__} holds tensors in {extra} that are not understood" if extra else None
