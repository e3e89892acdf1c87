"""Label values from snapshot text: printable, bounded in length, distinct when cut."""

from __future__ import annotations

import hashlib

from modelkv_exporter.contract.snapshot import Snapshot

DIAGNOSTIC_CHARS = 128
IDENTITY_CHARS = 256
DIGEST_CHARS = 8


def label(text: str | None, limit: int = DIAGNOSTIC_CHARS) -> str:
    """A safe label value: unprintable characters (controls, bidi and other format characters, line
    separators) become spaces; text longer than ``limit`` is cut, and ends with an ellipsis and 8 hex
    digits of the whole text's digest, so two long values that share their start stay apart.

    Two values can still meet once sanitised (a tab and a newline both become a space): the sidecar's
    budget check rejects a snapshot, or a later engine, whose series would collide.
    """
    if not text:
        return ""
    clean = text if text.isprintable() else "".join(ch if ch.isprintable() else " " for ch in text)
    if len(clean) <= limit:
        return clean
    digest = hashlib.blake2s(text.encode("utf-8", "surrogatepass"), digest_size=DIGEST_CHARS // 2).hexdigest()
    return clean[: limit - DIGEST_CHARS - 1] + "…" + digest


def engine_labels(snapshot: Snapshot) -> list[str]:
    """The engine, model and stage label values of a snapshot."""
    who = snapshot.engine
    return [label(who.engine_id, IDENTITY_CHARS), label(who.model_label, IDENTITY_CHARS), label(who.stage_label)]
