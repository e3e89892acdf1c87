"""The words the page and ``inspect`` share: every legend once, how a missing figure and a geometry are written.

The findings' words are ``sidecar.attention``'s; the memory parts' words are ``sidecar.breakdown``'s; these are
the rest. A renderer adds markup or line breaks, never words of its own for the same thing.
"""

from __future__ import annotations

from modelkv_exporter.contract.snapshot import Declaration, KVLayout

ABSENT = "—"
"""A figure the snapshot does not hold: never written as 0."""

GEOMETRY_LEGEND = "geometry: layers × kv_heads × head_dim × positions per row, then the element type"
OBSERVED_LEGEND = (
    "observed peak: the most the owner's transformers caches held at once since the engine started; "
    "recent: within its last sample interval; live: what they hold now; calls: those that used a cache / all "
    "calls into the owner"
)
DISCOVERED_LEGEND = (
    "discovered: modules that hold cache memory they do not declare; found by cache_layer: a transformers cache "
    "built while no declaring owner ran; census: tensors the module holds that it did not hold after "
    "initialisation; layout seen: layers × kv_heads × head_dim × positions a row, the element type, and rows"
)
STATUS_LEGEND = (
    "status: ok, attention (and why), died (ended of out-of-memory or an error, or vanished: killed), stale, ended "
    "or forgotten, judged from each snapshot alone; "
    "unexplained growth above the alert's threshold is a finding here, and pages (ModelKVUndeclaredMemoryGrowth) "
    "once it lasts 15 minutes"
)
GROWTH_LEGEND = (
    "growth since baseline: measured memory now minus the engine's post-initialisation baseline; "
    "growth source: the measurement it is taken from"
)
PARTS_LEGEND = (
    "growth by part, as the rules judge it (modelkv_engine:undeclared_memory_bytes): live tensors: the floor of "
    "live tensors (between engine steps) above the live tensors after initialisation, or the high-water mark above "
    "that plus the profiled activation peak, whichever is larger (the rule reads the floor's lowest of 10 minutes); "
    "outside torch: the process's device memory less the caching allocator's growth; resident: a CPU engine's "
    "figure; caches explain: what the model-local caches held recently, or declare; unexplained: the rest"
)
GROWTH_COLUMNS = ("live tensors", "outside torch", "resident", "caches explain", "unexplained", "alert")
"""The columns of an engine's growth since baseline by part (``PARTS_LEGEND``), after the engine's id on the page."""
SKIPPED = "files past --max-spool-files or --max-spool-bytes not read"
"""What the page, ``inspect`` and ``check`` say of the files a scan left unread, after their count."""


def geometry_words(d: Declaration) -> str:
    """``8 × 16 × 64 × 4096 bfloat16``: a declaration's geometry as ``GEOMETRY_LEGEND`` reads it."""
    return f"{d.layers} × {d.kv_heads} × {d.head_dim} × {d.physical_capacity_positions} {d.dtype}"


def layout_words(layout: KVLayout | None) -> str:
    """``8 × 16 × 64 × 4096 bfloat16, 4 rows``: a discovered layout as ``DISCOVERED_LEGEND`` reads it."""
    if layout is None:
        return "no key/value layout seen"
    rows = f"{layout.rows} row" + ("" if layout.rows == 1 else "s")
    return f"{layout.layers} × {layout.kv_heads} × {layout.head_dim} × {layout.positions} {layout.dtype}, {rows}"


def plural(count: int, noun: str) -> str:
    """``1 engine``, ``3 engines``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
