"""The model-local KV declaration protocol: our implementation of vLLM-Omni's contract.

Some models keep attention KV in HuggingFace ``transformers`` cache objects instead
of the engine's paged KV manager. The module that owns such a cache *declares* it:
geometry, physical capacity, lifetime scope and what sets its row count. This module
describes; it never allocates.

Names, fields, arithmetic and collector behaviour follow the protocol that ships as
``vllm_omni.model_executor.models.model_local_kv`` (vLLM-Omni 0.30.0). Everything
here that consumes specs accepts any object with the same fields, so specs built by
vLLM-Omni's own module work wherever ours do.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

from modelkv_exporter.contract import arithmetic
from modelkv_exporter.contract.vocabulary import ModelLocalKVScope, RowDriver
from modelkv_exporter.engine.engine_log import get_logger
from modelkv_exporter.engine.module_walk import walk_modules

logger = get_logger("protocol")

__all__ = [
    "HasModelLocalKV",
    "ModelLocalKVScope",
    "ModelLocalKVSpec",
    "RowDriver",
    "Collected",
    "DeclarerFailure",
    "OwnedSpec",
    "collect_declarations",
    "collect_model_local_kv_specs",
    "driver_value",
    "element_size",
    "near_misses",
    "spec_from_hf_config",
]


def element_size(dtype: Any) -> int:
    """Bytes of one element of ``dtype`` (a ``torch.dtype``)."""
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int) and size > 0:
        return size
    return torch.empty((), dtype=dtype).element_size()


def driver_value(rows: Any) -> str:
    """The plain string of a row driver, whichever module's enum (or string) it is."""
    return str(getattr(rows, "value", rows))


@dataclass(frozen=True)
class ModelLocalKVSpec:
    """One declared KV allocation: one entry per distinct lifetime, not per cache object."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    physical_capacity_positions: int
    """Positions the tensor can physically hold (a sliding window holds ``window - 1``)."""

    capacity_source: str
    """Free text: where the bound comes from. Diagnostic only; never branch on it."""

    scope: ModelLocalKVScope
    """How long one allocation lives. Diagnostic only; ``rows`` sets the multiplier."""

    rows: RowDriver
    """What sets how many rows of this shape are live at peak. Required on purpose."""

    rows_fixed: int = 1
    """The count when ``rows`` is ``FIXED``; ignored otherwise."""

    rows_reason: str = ""
    """Why ``rows_fixed`` is that number; required when ``rows`` is ``FIXED``."""

    allocation_note: str | None = None
    """Optional layout detail such as "rebuilt per text segment". Diagnostic only."""

    def __post_init__(self) -> None:
        if driver_value(self.rows) == RowDriver.FIXED.value:
            if self.rows_fixed < 1:
                raise ValueError(f"rows_fixed must be >= 1, got {self.rows_fixed}")
            if not self.rows_reason.strip():
                raise ValueError("a FIXED row count needs rows_reason; an unexplained constant cannot be reviewed")

    @property
    def bytes_per_row(self) -> int:
        """Bytes for a single batch row of this cache."""
        return arithmetic.bytes_per_row(
            layers=self.layers,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            positions=self.physical_capacity_positions,
            element_size=element_size(self.dtype),
        )

    def row_count(self, max_num_seqs: int = 1) -> int:
        """Rows live at peak, given the engine's concurrency."""
        return arithmetic.row_count(driver_value(self.rows), self.rows_fixed, max_num_seqs)

    def peak_bytes(self, max_num_seqs: int = 1) -> int:
        """Peak bytes once the engine's concurrency is known."""
        return self.bytes_per_row * self.row_count(max_num_seqs)


def _first_attribute(config: object, candidates: Sequence[str], what: str) -> int:
    for attr in candidates:
        value = getattr(config, attr, None)
        if value is not None:
            return int(value)
    raise ValueError(
        f"Cannot determine {what} from {type(config).__name__}: tried "
        f"{', '.join(candidates)}. Pass it explicitly to spec_from_hf_config()."
    )


def spec_from_hf_config(
    config: object,
    *,
    name: str,
    physical_capacity_positions: int,
    capacity_source: str,
    scope: ModelLocalKVScope,
    dtype: torch.dtype,
    rows: RowDriver,
    rows_fixed: int = 1,
    rows_reason: str = "",
    allocation_note: str | None = None,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
) -> ModelLocalKVSpec:
    """Build a spec from the HF config the cache is built from.

    Geometry not passed explicitly is looked up on ``config``; a missing attribute
    raises instead of guessing, since a wrong geometry would under-report.
    """
    if layers is None:
        layers = _first_attribute(config, ("num_hidden_layers", "encoder_layers", "num_layers"), "layer count")
    if kv_heads is None:
        kv_heads = _first_attribute(
            config,
            ("num_key_value_heads", "num_attention_heads", "encoder_attention_heads"),
            "kv head count",
        )
    if head_dim is None:
        explicit = getattr(config, "head_dim", None)
        if explicit is not None:
            head_dim = int(explicit)
        else:
            hidden = _first_attribute(config, ("hidden_size", "d_model"), "hidden size")
            heads = _first_attribute(
                config,
                ("num_attention_heads", "encoder_attention_heads"),
                "attention head count",
            )
            head_dim = hidden // heads
    return ModelLocalKVSpec(
        name=name,
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        physical_capacity_positions=physical_capacity_positions,
        capacity_source=capacity_source,
        scope=scope,
        rows=rows,
        rows_fixed=rows_fixed,
        rows_reason=rows_reason,
        allocation_note=allocation_note,
    )


@runtime_checkable
class HasModelLocalKV(Protocol):
    """Implemented by whichever object owns the cache (usually an inner module)."""

    def model_local_kv_specs(self) -> Sequence[ModelLocalKVSpec]:
        """Every KV allocation this object owns."""
        ...


def unwrap_model(model: object) -> object:
    """The real module tree behind ``model``: ``unwrap()`` (vLLM's CUDAGraphWrapper) followed down to it."""
    seen: set[int] = set()
    current = model
    while id(current) not in seen:
        seen.add(id(current))
        unwrap = getattr(current, "unwrap", None)
        if not callable(unwrap):
            return current
        try:
            inner = unwrap()
        except Exception:
            return current
        if inner is None or inner is current:
            return current
        current = inner
    return current


_METHOD = "model_local_kv_specs"


def _owns(obj: object, by_type: dict[type, bool]) -> bool:
    """``isinstance(obj, HasModelLocalKV)`` at dictionary speed: the answer is cached per class.

    A runtime-checkable Protocol check costs about 12 us; on a 10,000-module model
    that alone is over 100 ms. An instance that carries the method itself (not its
    class) is still found through its ``__dict__``.
    """
    kind = type(obj)
    owns = by_type.get(kind)
    if owns is None:
        owns = by_type[kind] = hasattr(kind, _METHOD)
    return owns or _METHOD in getattr(obj, "__dict__", ())


def _owners(root: object) -> list[tuple[str, HasModelLocalKV]]:
    by_type: dict[type, bool] = {}
    found: list[tuple[str, object]] = []
    if isinstance(root, torch.nn.Module):
        found += walk_modules(root, lambda module: _owns(module, by_type))
    else:
        if _owns(root, by_type):
            found.append(("", root))
        named_modules = getattr(root, "named_modules", None)
        seen = {id(root)}
        for path, module in named_modules() if callable(named_modules) else ():
            if id(module) not in seen and _owns(module, by_type):
                seen.add(id(module))
                found.append((path, module))
    owners: list[tuple[str, HasModelLocalKV]] = found  # type: ignore[assignment]
    return owners


def declaring_owners(model: object) -> list[tuple[str, HasModelLocalKV]]:
    """Every object in a loaded model that declares model-local KV, with its module path (``""`` = root)."""
    return _owners(unwrap_model(model))


NEAR_MISS_RATIO = 0.85
"""How alike a method name must be to ``model_local_kv_specs`` (``difflib``'s ratio) to be named as a misspelling."""


def _near_miss_names(kind: type) -> tuple[str, ...]:
    """Names defined by ``kind`` or a base outside torch that look like ``model_local_kv_specs`` and are not it."""
    if hasattr(kind, _METHOD):
        return ()
    found: list[str] = []
    for klass in kind.__mro__:
        if klass.__module__.split(".")[0] in ("torch", "builtins"):
            continue
        for name in vars(klass):
            if name != _METHOD and difflib.SequenceMatcher(None, name, _METHOD).ratio() >= NEAR_MISS_RATIO:
                found.append(name)
    return tuple(dict.fromkeys(found))


def near_misses(model: object) -> list[tuple[str, str, str]]:
    """``(path, class, name)`` of every module that defines a method named almost ``model_local_kv_specs``
    (``model_local_kv_spec``, ``model_local_kv_spces``) and not that one: a declaration the engine never asks for."""
    root = unwrap_model(model)
    modules = walk_modules(root) if isinstance(root, torch.nn.Module) else iter([("", root)])
    by_type: dict[type, tuple[str, ...]] = {}
    found = []
    for path, module in modules:
        kind = type(module)
        names = by_type.get(kind)
        if names is None:
            names = by_type[kind] = _near_miss_names(kind)
        found += [(path, kind.__name__, name) for name in names]
    return found


class OwnedSpec(NamedTuple):
    """A declaration with where it came from: the owner's module path and class name."""

    owner_path: str
    owner_class: str
    spec: Any


ERROR_CHARS = 300
"""How much of an exception's text a dropped declaration keeps."""


def error_text(error: BaseException) -> str:
    """``Type: message`` of an exception, cut to ``ERROR_CHARS``."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


class DeclarerFailure(NamedTuple):
    """An owner whose ``model_local_kv_specs()`` raised (or returned something that is not a sequence)."""

    owner_path: str
    owner_class: str
    error: str


class Collected(NamedTuple):
    """Every declaration a model made, and every declarer that failed to make its own."""

    specs: list[OwnedSpec]
    failures: list[DeclarerFailure]


def collect_declarations(model: object) -> Collected:
    """Every declaration in a loaded model with its owner's path and class, and the declarers that failed.

    Walks ``named_modules()`` from the unwrapped root; each owner is asked once.
    A declarer that raises is logged, recorded and skipped: reporting memory must
    never break model load. A model without declarers gives two empty lists.
    """
    collected: list[OwnedSpec] = []
    failures: list[DeclarerFailure] = []
    for path, owner in declaring_owners(model):
        owner_class = type(owner).__name__
        try:
            specs = list(owner.model_local_kv_specs())
        except Exception as error:
            logger.warning("model_local_kv_specs() raised on %s; skipping its declaration", owner_class, exc_info=True)
            failures.append(DeclarerFailure(path, owner_class, error_text(error)))
            continue
        collected.extend(OwnedSpec(path, owner_class, spec) for spec in specs)
    return Collected(collected, failures)


def collect_model_local_kv_specs(model: object) -> list[tuple[str, Any]]:
    """Every declaration in a loaded model as ``(owner_path, spec)`` pairs: vLLM-Omni's collector, by its name and
    in its form, so that code written against its module runs on ours (``collect_declarations`` is the full one)."""
    return [(owned.owner_path, owned.spec) for owned in collect_declarations(model).specs]
