"""Real vLLM-Omni 0.30.0 declarers, built without weights, through our collector, spool and /metrics."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import DynamicCache, Qwen2Config
from vllm_omni.model_executor.models.ming_flash_omni.talker_module import MingAudioGenerator  # noqa: E402
from vllm_omni.model_executor.models.qwen3_tts.segmented_graph_wrapper import CUDAGraphDecoderWrapper  # noqa: E402
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (  # noqa: E402
    Qwen3TTSTokenizerV2DecoderConfig,
)
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (  # noqa: E402
    Qwen3TTSTokenizerV2Decoder,
)

from modelkv_exporter import publish
from modelkv_exporter.demo.owners import cache_bytes
from tests.support.exposition import Exposition
from tests.support.processes import Sidecar

CODEC_ROW = 2 * 8 * 16 * 64 * 71 * 4
MING_ROW = 2 * 24 * 2 * 64 * 2048 * 2


def ming_generator() -> MingAudioGenerator:
    generator = object.__new__(MingAudioGenerator)
    generator._llm_config = Qwen2Config(
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, hidden_size=896, head_dim=64
    )
    generator._model = nn.Linear(2, 2).to(torch.bfloat16)
    return generator


def codec_decoder(async_chunk: bool | None, captured: tuple[int, ...] = ()) -> Qwen3TTSTokenizerV2Decoder:
    """The decoder without weights; ``None`` = no graph wrapper (eager, stateless)."""
    decoder = object.__new__(Qwen3TTSTokenizerV2Decoder)
    nn.Module.__init__(decoder)
    decoder.config = Qwen3TTSTokenizerV2DecoderConfig()
    decoder.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)
    decoder._cudagraph_wrapper = None
    if async_chunk is not None:
        wrapper = object.__new__(CUDAGraphDecoderWrapper)
        wrapper.decoder = decoder
        wrapper.async_chunk = async_chunk
        wrapper.prefix_length = decoder.config.sliding_window
        wrapper.combined_states = {rows: {"cache": {"kv": retained_cache(rows)}} for rows in captured}
        wrapper.icl_prefix_states = {}
        wrapper.xvec_prefix_states = {}
        decoder._cudagraph_wrapper = wrapper
    return decoder


def retained_cache(rows: int) -> DynamicCache:
    """A real cache as a capture leaves it: sliding window full, ``rows`` wide."""
    cache = DynamicCache()
    states = torch.zeros(rows, 16, 71, 64)
    for layer in range(8):
        cache.update(states, states, layer)
    return cache


def declared(sidecar: Sidecar) -> dict[tuple[str, str], float]:
    families = Exposition(sidecar.get("/metrics").text)
    return {
        (s.labels["engine"], s.labels["cache"]): s.value
        for f in families
        if f.name == "modelkv_declared_peak_bytes"
        for s in f.samples
    }


def test_ming_talker_declares_one_fixed_row(sidecar: Sidecar) -> None:
    path = publish(ming_generator(), spool_dir=sidecar.spool_dir, max_num_seqs=32, engine_id="ming")
    assert path.exists()
    assert declared(sidecar) == {("ming", "talker_llm_static_cache"): MING_ROW}


def test_qwen3_tts_stateless_declares_nothing_and_async_chunk_declares_three(sidecar: Sidecar) -> None:
    captured = (1, 2, 4)
    publish(codec_decoder(None), spool_dir=sidecar.spool_dir, max_num_seqs=8, engine_id="eager")
    publish(codec_decoder(False, captured), spool_dir=sidecar.spool_dir, max_num_seqs=8, engine_id="stateless")
    publish(codec_decoder(True, captured), spool_dir=sidecar.spool_dir, max_num_seqs=8, engine_id="async")
    pool_bytes = sum(cache_bytes(retained_cache(rows)) for rows in captured)
    assert pool_bytes == CODEC_ROW * sum(captured)
    assert declared(sidecar) == {
        ("stateless", "codec_decoder_graph_pool"): pool_bytes,
        ("async", "codec_decoder_request"): CODEC_ROW * 8,
        ("async", "codec_decoder_working_copy"): CODEC_ROW * 8,
        ("async", "codec_decoder_graph_pool"): pool_bytes,
    }
    engines = {
        e["snapshot"]["engine"]["engine_id"]: e["snapshot"] for e in sidecar.get("/api/v1/engines").json()["engines"]
    }
    assert engines["eager"]["declarations"] == []
    reasons = {d["name"]: d["rows_reason"] for d in engines["async"]["declarations"]}
    assert "retained caches" in reasons["codec_decoder_graph_pool"]


@pytest.mark.parametrize("max_num_seqs", [1, 64])
def test_max_num_seqs_scales_only_per_sequence_caches(sidecar: Sidecar, max_num_seqs: int) -> None:
    model = nn.Module()
    model.talker = nn.Module()
    model.code2wav = codec_decoder(True, (1,))
    model.generator_host = nn.Module()
    publish(model, spool_dir=sidecar.spool_dir, max_num_seqs=max_num_seqs, engine_id="e")
    got = declared(sidecar)
    assert got[("e", "codec_decoder_request")] == CODEC_ROW * max_num_seqs
    assert got[("e", "codec_decoder_graph_pool")] == CODEC_ROW
