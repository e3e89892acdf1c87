"""The byte arithmetic of the declaration protocol, free of torch.

One place for the formula, shared by the engine's ``ModelLocalKVSpec``, by the resolver that
turns any spec-like object (ours or vLLM-Omni's) into a snapshot record, and by the sidecar
when it checks that a snapshot adds up.
"""

from __future__ import annotations

from modelkv_exporter.contract.vocabulary import RowDriver


def bytes_per_row(*, layers: int, kv_heads: int, head_dim: int, positions: int, element_size: int) -> int:
    """Bytes of one batch row: K and V for every layer, head and position."""
    return 2 * layers * kv_heads * head_dim * positions * element_size


def row_count(driver: str, rows_fixed: int, max_num_seqs: int) -> int:
    """Rows live at peak: the fixed count, or one per in-flight sequence (at least 1)."""
    if driver == RowDriver.FIXED.value:
        return rows_fixed
    return max(1, max_num_seqs)
