"""What the hook publishes about a worker (``WorkerFacts``), and the readers of vLLM's loosely typed values.

Both kinds of worker the hook patches are read with these: vLLM's (``identity``) and vLLM-Omni's
``DiffusionWorker`` (``diffusion``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerFacts:
    """What the hook publishes about a worker after its model loaded.

    ``settled_at_load``: the worker has no later initialisation step the hook sees, so the
    measured baseline is taken at load. ``worker_rank`` tells apart workers of one engine
    that vLLM's parallel ranks do not (a diffusion stage's workers).
    """

    identity: dict[str, Any]
    max_num_seqs: int | None
    model: Any
    settled_at_load: bool = False
    worker_rank: int | None = None


def rank_of(group: str) -> int | None:
    """This process's rank in vLLM's ``group`` ("tp", "pp"), None when vLLM has none."""
    try:
        from vllm import distributed

        return int(getattr(distributed, f"get_{group}_group")().rank_in_group)
    except Exception:
        return None


def first(value: Any) -> str | None:
    """The first item of a list or tuple (else the value) as text; None for nothing."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return None if value is None else str(value)


def as_int(value: Any) -> int | None:
    """An int, or a string of digits as an int; anything else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else None
