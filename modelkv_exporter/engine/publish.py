"""``publish``: declarations of a loaded model into the spool, for any engine and for tests."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelkv_exporter.contract.snapshot import EngineIdentity, EngineSettings, Snapshot
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.contract.version import VERSION
from modelkv_exporter.engine.protocol import collect_declarations
from modelkv_exporter.engine.resolve import declarer_failures, resolve_owned

if TYPE_CHECKING:
    from modelkv_exporter.engine.observe import Observer

_IDENTITY_FIELDS = frozenset(f.name for f in fields(EngineIdentity)) - {"engine_id"}
_SETTING_FIELDS = frozenset(f.name for f in fields(EngineSettings)) - {"max_num_seqs"}


def build_snapshot(model: object, /, *, max_num_seqs: int | None, engine_id: str, **identity: Any) -> Snapshot:
    """Collect ``model``'s declarations, resolve them at ``max_num_seqs``, and add identity.

    Declarers that raised and specs that could not be resolved are recorded in
    ``dropped_declarations`` (and logged), never raised. ``max_num_seqs=None`` is for an
    engine without one: only ``FIXED`` declarations are published (per-sequence ones are
    dropped as unresolvable), and the snapshot says so (``settings.max_num_seqs`` absent,
    schema_version 2).

    Keyword arguments name ``EngineIdentity`` fields (``model``, ``stage_name``,
    ``tp_rank``, ...) or ``EngineSettings`` fields (``gpu_memory_utilization``,
    ``paged_kv_bytes``, ``paged_kv_blocks``, ``weights_bytes``, ...); anything else is a ``TypeError``.
    """
    unknown = identity.keys() - _IDENTITY_FIELDS - _SETTING_FIELDS
    if unknown:
        raise TypeError(f"unknown snapshot fields: {', '.join(sorted(unknown))}")
    if max_num_seqs is not None and max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    who = {k: v for k, v in identity.items() if k in _IDENTITY_FIELDS}
    who.setdefault("pid", os.getpid())
    who.setdefault("hostname", socket.gethostname())
    collected = collect_declarations(model)
    declarations, unresolved = resolve_owned(collected.specs, max_num_seqs)
    now = time.time()
    return Snapshot(
        engine=EngineIdentity(engine_id=engine_id, **who),
        settings=EngineSettings(
            max_num_seqs=max_num_seqs,
            **{k: v for k, v in identity.items() if k in _SETTING_FIELDS},
        ),
        declarations=declarations,
        started_at=now,
        heartbeat_at=now,
        writer=f"modelkv-exporter/{VERSION}",
        dropped_declarations=declarer_failures(collected.failures) + unresolved,
    )


def publish(
    model: object,
    /,
    *,
    spool_dir: str | os.PathLike[str],
    max_num_seqs: int | None,
    engine_id: str,
    observer: Observer | None = None,
    **identity: Any,
) -> Path:
    """Write ``model``'s resolved declarations as engine ``engine_id``'s snapshot; return its path.

    With ``observer`` (``engine.observe.install(declaring_owners(model))``, the model driven since), the snapshot
    carries what each owner's caches held (``observer.sample()``), so that ``modelkv-exporter check`` can judge
    the declarations; without it, declarations only, which nothing can judge.
    A one-shot snapshot carries no heartbeat interval, so the sidecar never marks
    it stale; use ``SnapshotPublisher`` to keep a live engine's snapshot beating.
    """
    snapshot = build_snapshot(model, max_num_seqs=max_num_seqs, engine_id=engine_id, **identity)
    if observer is not None:
        snapshot = replace(snapshot, observations=observer.sample())
    return write_snapshot(spool_dir, snapshot)
