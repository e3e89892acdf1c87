"""Declared bytes equal the bytes of real transformers caches built from the same config."""

from __future__ import annotations

import pytest
import torch

from modelkv_exporter.demo import owners
from modelkv_exporter.demo.engines import DEMO_ENGINES, UNDER_DECLARING, build_model
from modelkv_exporter.engine.observe import Observer
from modelkv_exporter.engine.protocol import declaring_owners
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


def test_a_sliding_window_cache_keeps_the_whole_last_update_allocated() -> None:
    """The view holds window - 1 positions, the storage window - 1 + n after n new ones: weigh the storage."""
    owner = owners.CodecDecoder()
    spec = owner.model_local_kv_specs()[0]
    cache = owner.build_cache(spec, rows=2)
    assert owners.cache_bytes(cache) == spec.peak_bytes(2), "as built, it holds what it declares"
    longer = torch.zeros(2, spec.kv_heads, 500, spec.head_dim)
    for layer in range(spec.layers):
        cache.update(longer, longer.clone(), layer)
    views = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert views == spec.peak_bytes(2)
    assert owners.cache_bytes(cache) == spec.peak_bytes(2) * (71 + 500) // 71


def test_every_demo_engine_snapshot_matches_its_real_caches() -> None:
    for engine in DEMO_ENGINES:
        model = build_model(engine)
        snapshot = build_snapshot(model, max_num_seqs=engine.max_num_seqs, engine_id=engine.engine_id)
        held: dict[str, int] = {}
        for module in model.modules():
            if isinstance(module, owners.DemoOwner):
                module.allocate(engine.max_num_seqs)
                held.update(module.held_bytes())
        undeclared = held.pop(owners.EagerCodecDecoder.UNDECLARED, 0)
        assert {d.name: d.peak_bytes for d in snapshot.declarations} == held
        assert {d.owner for d in snapshot.declarations} == {path for path, _ in engine.owners}
        if engine.engine_id == UNDER_DECLARING:
            assert undeclared == snapshot.declared_peak_bytes // 2 > 0, "it holds half as much again"
        else:
            assert undeclared == 0


def test_every_demo_owner_is_observed_holding_what_it_declares_but_the_deliberate_one(observer: Observer) -> None:
    ratios = {}
    for engine in DEMO_ENGINES:
        model = build_model(engine)
        snapshot = build_snapshot(model, max_num_seqs=engine.max_num_seqs, engine_id=engine.engine_id)
        observer.add_owners(declaring_owners(model))
        for module in model.modules():
            if isinstance(module, owners.DemoOwner):
                module.allocate(engine.max_num_seqs)
        mine = {path for path, _ in engine.owners}
        for observation in observer.sample():
            if observation.owner in mine:
                assert observation.available and observation.cache_calls == 1, observation
                declared = sum(d.peak_bytes for d in snapshot.declarations if d.owner == observation.owner)
                assert observation.peak_bytes == observation.live_bytes
                ratios[engine.engine_id] = (observation.peak_bytes or 0) / declared
        del model
    assert ratios == {e.engine_id: 1.5 if e.engine_id == UNDER_DECLARING else 1.0 for e in DEMO_ENGINES if e.owners}
