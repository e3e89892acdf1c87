"""An engine without max_num_seqs (a diffusion stage whose config has none): fixed caches published, per-sequence ones dropped."""

from __future__ import annotations

import torch
from torch import nn

from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_exporter.sidecar.reader.decode import parse_snapshot


def spec(name: str, rows: RowDriver) -> ModelLocalKVSpec:
    return ModelLocalKVSpec(
        name=name,
        layers=2,
        kv_heads=2,
        head_dim=64,
        dtype=torch.float32,
        physical_capacity_positions=16,
        capacity_source="test",
        scope=ModelLocalKVScope.REQUEST,
        rows=rows,
        rows_fixed=3 if rows is RowDriver.FIXED else 1,
        rows_reason="three prompts" if rows is RowDriver.FIXED else "",
    )


class TextEncoder(nn.Module):
    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        return [spec("prompt_cache", RowDriver.FIXED), spec("per_request", RowDriver.MAX_NUM_SEQS)]


def test_without_max_num_seqs_only_fixed_rows_are_published_and_the_rest_is_counted_as_dropped() -> None:
    pipeline = nn.Module()
    pipeline.text_encoder = TextEncoder()
    snapshot = build_snapshot(pipeline, max_num_seqs=None, engine_id="image-s2")
    assert [(d.name, d.row_count) for d in snapshot.declarations] == [("prompt_cache", 3)]
    (dropped,) = snapshot.dropped_declarations or ()
    assert (dropped.owner, dropped.reason, dropped.count) == ("text_encoder", "unresolvable_spec", 1)
    assert "has no max_num_seqs" in dropped.error
    assert snapshot.settings.max_num_seqs is None and snapshot.schema_version == 2
    assert parse_snapshot(snapshot.to_json()) == snapshot
    with_it = build_snapshot(pipeline, max_num_seqs=5, engine_id="image-s2")
    assert [d.row_count for d in with_it.declarations] == [3, 5] and with_it.schema_version == 1
