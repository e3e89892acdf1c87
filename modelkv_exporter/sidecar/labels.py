"""Label values from snapshot text: printable, bounded in length."""

from __future__ import annotations

import unicodedata

from modelkv_exporter.contract.snapshot import Snapshot

DIAGNOSTIC_CHARS = 128
IDENTITY_CHARS = 256


def label(text: str | None, limit: int = DIAGNOSTIC_CHARS) -> str:
    """A safe label value: control characters become spaces, long text is cut with an ellipsis."""
    if not text:
        return ""
    if not text.isprintable():
        text = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def engine_labels(snapshot: Snapshot) -> list[str]:
    """The engine, model and stage label values of a snapshot."""
    who = snapshot.engine
    return [label(who.engine_id, IDENTITY_CHARS), label(who.model_label, IDENTITY_CHARS), label(who.stage_label)]
