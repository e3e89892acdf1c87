"""The spool as one JSON document, for ``GET /api/v1/engines``: the document's fields, one entry at a time."""

from __future__ import annotations

from typing import Any

from modelkv_exporter.contract.snapshot import SCHEMA_VERSION
from modelkv_exporter.sidecar.breakdown import breakdown
from modelkv_exporter.sidecar.discovered import discovery_running, exported_discovery
from modelkv_exporter.sidecar.post_mortem import post_mortem
from modelkv_exporter.sidecar.prescription import Prescription, prescription
from modelkv_exporter.sidecar.presentation.safe_text import SPOOL_UNREADABLE, client_detail, printable
from modelkv_exporter.sidecar.reader.state import Classified, EngineState, SpoolView


def entry_document(item: Classified, max_discovered: int) -> dict[str, Any]:
    """One file: an engine's snapshot with its state, or a rejected file with its reason.

    The snapshot is the whole of it, every discovered owner included; where the engine runs discovery,
    ``discovered_owners_omitted`` says how many of them /metrics leaves out (past ``max_discovered``, the
    smallest first); where its latest sample has a process figure, ``memory_breakdown`` holds the parts
    ``modelkv_memory_breakdown_bytes`` exports, the figure they split and its name; ``prescription`` the KV cache
    memory to give vLLM (``sidecar.prescription``), each figure null with its reason where it cannot be computed; for an engine that died or
    vanished, ``post_mortem`` holds why, when, what grew by part and the part that grew most (the snapshot's own
    ``end`` is in ``snapshot``, as the engine wrote it). File names are shown with any byte that is not UTF-8 escaped; OS errors stay in the log.
    """
    entry = item.entry
    file = printable(entry.file_name)
    if item.state is EngineState.REJECTED:
        assert entry.error is not None
        return {"file": file, "reason": entry.error.reason.value, "detail": client_detail(entry.error)}
    document = {"file": file, "state": item.state.value, "snapshot": item.snapshot.to_dict()}
    if discovery_running(item.snapshot):
        document["discovered_owners_omitted"] = exported_discovery(item.snapshot, max_discovered).omitted
    parts = breakdown(item.snapshot)
    if parts is not None:
        document["memory_breakdown"] = {"of": parts.total_source, "bytes": parts.total, "parts": dict(parts.parts)}
    document["prescription"] = prescription_document(prescription(item.snapshot))
    dead = post_mortem(item.snapshot, item.state)
    if dead is not None:
        document["post_mortem"] = dead.document()
    return document


def prescription_document(found: Prescription) -> dict[str, Any]:
    """An engine's prescription as JSON: every figure, null with its reason where it cannot be computed."""
    return {
        "kv_cache_memory_bytes": found.kv_cache_bytes,
        "flag": found.flag,
        "reason": found.reason,
        "requested_memory_bytes": found.requested.bytes,
        "requested_memory_source": found.requested.source,
        "needs": dict(found.needs),
        "margin_bytes": found.margin,
        "chosen_kv_cache_bytes": found.chosen_kv_bytes,
        "difference_bytes": found.difference,
        "gpu_memory_utilization": found.gpu_memory_utilization,
        "gpu_memory_utilization_reason": found.utilization_reason,
        "torch_headroom_bytes": found.headroom_bytes,
        "kept_torch_headroom_bytes": found.kept_headroom_bytes,
        "activation_peak_off_bytes": found.activation_off,
        "non_torch_off_bytes": found.non_torch_off,
    }


def document_fields(view: SpoolView, spool_name: str) -> dict[str, Any]:
    """The document but for its ``engines`` and ``rejected`` lists; ``spool_dir`` is the directory's name, not its path."""
    return {
        "spool_dir": spool_name,
        "spool_error": None if view.scan.ok else SPOOL_UNREADABLE,
        "schema_version": SCHEMA_VERSION,
        "unread_files": view.scan.skipped,
    }
