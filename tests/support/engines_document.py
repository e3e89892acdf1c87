"""``/api/v1/engines``'s document built whole from one view, which the app sends in pieces (``http.pages``)."""

from __future__ import annotations

from modelkv_exporter.sidecar.presentation.engines_document import document_fields, entry_document
from modelkv_exporter.sidecar.reader.state import EngineState, SpoolView


def engines_document(view: SpoolView, spool_name: str, max_discovered: int) -> dict[str, object]:
    """Every engine's snapshot with its state, every rejected file with its reason."""
    return {
        **document_fields(view, spool_name),
        "engines": [entry_document(i, max_discovered) for i in view.entries if i.state is not EngineState.REJECTED],
        "rejected": [entry_document(i, max_discovered) for i in view.entries if i.state is EngineState.REJECTED],
    }
