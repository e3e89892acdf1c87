"""The spool as one JSON document, for ``GET /api/v1/engines``."""

from __future__ import annotations

from typing import Any

from modelkv_exporter.contract.snapshot import SCHEMA_VERSION
from modelkv_exporter.contract.state import EngineState, SpoolView
from modelkv_exporter.sidecar.http.public import SPOOL_UNREADABLE, public_detail, visible


def engines_document(view: SpoolView, spool_name: str) -> dict[str, Any]:
    """Every engine's snapshot with its state, and every rejected file with its reason.

    ``spool_dir`` is the spool directory's name, not its path; file names are shown with any byte
    that is not UTF-8 escaped; OS errors stay in the log.
    """
    engines = []
    rejected = []
    for item in view.entries:
        entry = item.entry
        file = visible(entry.file_name)
        if item.state is EngineState.REJECTED:
            assert entry.error is not None
            rejected.append({"file": file, "reason": entry.error.reason.value, "detail": public_detail(entry.error)})
        else:
            engines.append({"file": file, "state": item.state.value, "snapshot": item.snapshot.to_dict()})
    return {
        "spool_dir": spool_name,
        "spool_error": None if view.scan.ok else SPOOL_UNREADABLE,
        "schema_version": SCHEMA_VERSION,
        "engines": engines,
        "rejected": rejected,
        "unread_files": view.scan.skipped,
    }
