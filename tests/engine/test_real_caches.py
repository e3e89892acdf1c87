"""Declared bytes equal the bytes of real transformers caches built from the same config."""

from __future__ import annotations

import pytest
import torch

from modelkv_exporter.demo import owners
from modelkv_exporter.demo.engines import DEMO_ENGINES, build_model
from modelkv_exporter.engine.publish import build_snapshot

OWNERS = [owners.CodecDecoder, owners.LocalTransformer, owners.WhisperStreamingEncoder, owners.TalkerGenerator]

# Independent of the code under test: 2 (K, V) x layers x kv_heads x head_dim x positions x bytes per element.
KNOWN_ROW_BYTES = {
    "codec_decoder_request": 2 * 8 * 16 * 64 * 71 * 4,
    "codec_decoder_working_copy": 2 * 8 * 16 * 64 * 71 * 4,
    "codec_decoder_graph_pool": 2 * 8 * 16 * 64 * 71 * 4,
    "local_transformer": 2 * 16 * 64 * 16 * 11 * 2,
    "local_transformer_graph_pool": 2 * 16 * 64 * 16 * 11 * 2,
    "whisper_encoder_self_attn": 2 * 24 * 16 * 64 * 1500 * 2,
    "talker_llm_static_cache": 2 * 24 * 2 * 64 * 2048 * 2,
}


@pytest.mark.parametrize("owner_class", OWNERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("max_num_seqs", [1, 3])
def test_declared_bytes_equal_real_cache_bytes(owner_class: type[owners.DemoOwner], max_num_seqs: int) -> None:
    owner = owner_class()
    owner.allocate(max_num_seqs)
    held = owner.held_bytes()
    specs = owner.model_local_kv_specs()
    assert held.keys() == {s.name for s in specs}
    for spec in specs:
        assert spec.bytes_per_row == KNOWN_ROW_BYTES[spec.name]
        assert held[spec.name] == spec.peak_bytes(max_num_seqs) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_declared_bytes_follow_the_loaded_dtype(dtype: torch.dtype) -> None:
    owner = owners.TalkerGenerator().to(dtype)
    owner.allocate(1)
    (spec,) = owner.model_local_kv_specs()
    assert spec.dtype == dtype
    assert owner.held_bytes()[spec.name] == spec.peak_bytes(1) == 2 * 24 * 2 * 64 * 2048 * dtype.itemsize


def test_sliding_window_cache_holds_window_minus_one_positions_however_long_the_stream() -> None:
    owner = owners.CodecDecoder()
    spec = owner.model_local_kv_specs()[0]
    cache = owner.build_cache(spec, rows=2)
    longer = torch.zeros(2, spec.kv_heads, 500, spec.head_dim)
    for layer in range(spec.layers):
        cache.update(longer, longer, layer)
    assert owners.cache_bytes(cache) == spec.peak_bytes(2)


def test_every_demo_engine_snapshot_matches_its_real_caches() -> None:
    for engine in DEMO_ENGINES:
        model = build_model(engine)
        snapshot = build_snapshot(model, max_num_seqs=engine.max_num_seqs, engine_id=engine.engine_id)
        held: dict[str, int] = {}
        for module in model.modules():
            if isinstance(module, owners.DemoOwner):
                module.allocate(engine.max_num_seqs)
                held.update(module.held_bytes())
        assert {d.name: d.peak_bytes for d in snapshot.declarations} == held
        assert {d.owner for d in snapshot.declarations} == {path for path, _ in engine.owners}
