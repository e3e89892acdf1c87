"""The spool as one JSON document, for ``GET /api/v1/engines``."""

from __future__ import annotations

from typing import Any

from modelkv_exporter.contract.snapshot import SCHEMA_VERSION
from modelkv_exporter.contract.state import EngineState, SpoolView


def engines_document(view: SpoolView, spool_dir: str) -> dict[str, Any]:
    """Every engine's snapshot with its state, and every rejected file with its reason."""
    engines = []
    rejected = []
    for item in view.entries:
        entry = item.entry
        if item.state is EngineState.REJECTED:
            assert entry.error is not None
            rejected.append({"file": entry.file_name, "reason": entry.error.reason.value, "detail": entry.error.detail})
        else:
            engines.append({"file": entry.file_name, "state": item.state.value, "snapshot": item.snapshot.to_dict()})
    return {
        "spool_dir": spool_dir,
        "spool_error": view.scan.error,
        "schema_version": SCHEMA_VERSION,
        "engines": engines,
        "rejected": rejected,
    }
