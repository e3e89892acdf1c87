"""Real vLLM-Omni 0.30.0 declarers: built without weights, through our collector, spool and /metrics; and run.

The run tests drive the real classes on CPU with random weights the way vLLM-Omni drives them,
observe what their caches really hold, and compare it with what they declare. The figures are
recorded in docs/observed-caches.md; the Qwen3-TTS decoder's declaration is wrong on its eager
path, and these tests pin by how much.
"""

from __future__ import annotations

import types
from dataclasses import replace

import pytest
import torch
from torch import nn
from transformers import DynamicCache, Qwen2Config, Qwen2Model
from vllm_omni.model_executor.models.common.ming.aggregator import Aggregator  # noqa: E402
from vllm_omni.model_executor.models.mimo_audio.mimo_audio_llm import (  # noqa: E402
    MiMoAudioLLMForConditionalGeneration,
    MiMoAudioQwen2Model,
)
from vllm_omni.model_executor.models.ming_flash_omni.ming_flash_omni_talker import (  # noqa: E402
    MingFlashOmniTalkerForConditionalGeneration,
)
from vllm_omni.model_executor.models.ming_flash_omni.talker_module import CFM, DiT, MingAudioGenerator  # noqa: E402
from vllm_omni.model_executor.models.qwen3_tts.segmented_graph_wrapper import CUDAGraphDecoderWrapper  # noqa: E402
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (  # noqa: E402
    Qwen3TTSTokenizerV2DecoderConfig,
)
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (  # noqa: E402
    Qwen3TTSTokenizerV2Decoder,
)

from modelkv_exporter import publish
from modelkv_exporter.contract.snapshot import Observation
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.demo.owners import cache_bytes
from modelkv_exporter.engine.observe import Observer
from modelkv_exporter.engine.protocol import declaring_owners
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.processes import Sidecar

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


WINDOW = 72
POSITION = 2 * 8 * 16 * 64 * 4
"""Bytes of one position of one row of the decoder's cache: K and V, 8 layers, 16 kv heads, head_dim 64, float32."""


def running_decoder(rows: int, wrapper: bool) -> Qwen3TTSTokenizerV2Decoder:
    """The decoder with random weights: the real attention geometry, a shrunk codebook and upsampler (no KV).

    ``wrapper``: a ``CUDAGraphDecoderWrapper(async_chunk=True)`` attached but not capturing, as on a GPU
    with graphs enabled; it only makes the decoder declare, the eager path still runs.
    """
    config = Qwen3TTSTokenizerV2DecoderConfig(
        codebook_size=64,
        hidden_size=1024,
        latent_dim=64,
        num_attention_heads=16,
        num_key_value_heads=16,
        sliding_window=WINDOW,
        intermediate_size=256,
        num_hidden_layers=8,
        num_quantizers=4,
        upsample_rates=(2, 2, 2, 2),
        upsampling_ratios=(2, 2),
        decoder_dim=32,
    )
    config.codebook_dim = 64
    torch.manual_seed(0)
    decoder = Qwen3TTSTokenizerV2Decoder(config).eval()
    decoder._initial_codec_chunk_frames = 1
    decoder._incremental_chunk_frames = 25
    decoder._incremental_chunk_ramp = []
    if wrapper:
        decoder._cudagraph_wrapper = CUDAGraphDecoderWrapper(
            decoder=decoder,
            capture_batch_sizes=[rows],
            num_quantizers=4,
            enabled=False,
            async_chunk=True,
            initial_chunk_frames=1,
            codec_chunk_frames=25,
        )
        decoder._cudagraph_enabled = False
    return decoder


def stream(
    observer: Observer, decoder: Qwen3TTSTokenizerV2Decoder, rows: int, icl: bool, steps: int = 6, path: str = ""
) -> Observation:
    """Stream ``rows`` requests through ``batched_chunked_decode``, one call a step, as Qwen3TTSCode2Wav does.

    The first chunk carries the reference prefix (a full window in ICL mode, none in x-vector
    mode) and one frame, then 25 new frames a step. Returns the observation of the owner at
    ``path`` after the last step (the decoder itself, observed here, when ``path`` is empty).
    """
    if not path:
        observer.add_owners(declaring_owners(decoder))
    prefix = WINDOW if icl else 0
    states = [{"prefix_frames": prefix} for _ in range(rows)]
    observer.sample()
    for step in range(steps):
        new = prefix + 1 if step == 0 else 25
        codes = torch.randint(0, 64, (rows, 4, new))
        with torch.no_grad():
            wavs = decoder.batched_chunked_decode(
                codes, [new] * rows, caches=states, chunk_size=300, left_context_size=25, max_batch_size=0
            )
        assert len(wavs) == rows
    (observation,) = (o for o in observer.sample() if o.owner == path)
    return observation


def declared_positions(decoder: Qwen3TTSTokenizerV2Decoder, rows: int) -> float:
    return sum(spec.peak_bytes(rows) for spec in decoder.model_local_kv_specs()) / (POSITION * rows)


@pytest.mark.parametrize("rows", [1, 2])
def test_qwen3_tts_decoder_in_icl_mode_holds_2_18_times_its_declaration(observer: Observer, rows: int) -> None:
    """Retained 71 + batched copy 71 + working copy 71 + 97 new frames = 310 positions a row; it declares 142."""
    decoder = running_decoder(rows, wrapper=True)
    observation = stream(observer, decoder, rows, icl=True)
    assert declared_positions(decoder, rows) == 142
    assert observation.available and observation.cache_calls == observation.calls == 6
    assert observation.peak_bytes == observation.recent_peak_bytes == 310 * POSITION * rows
    assert observation.live_bytes == 71 * POSITION * rows, "between steps: the retained request caches"


def test_qwen3_tts_decoder_in_xvec_mode_holds_less_than_it_declares(observer: Observer) -> None:
    rows = 2
    decoder = running_decoder(rows, wrapper=True)
    observation = stream(observer, decoder, rows, icl=False)
    assert declared_positions(decoder, rows) == 142
    assert observation.peak_bytes == 97 * POSITION * rows and observation.live_bytes == 0


def test_qwen3_tts_decoder_without_its_graph_wrapper_declares_nothing_and_holds_as_much(observer: Observer) -> None:
    """CPU, enforce_eager or load_format=dummy: no wrapper, no declaration, the same caches."""
    decoder = running_decoder(1, wrapper=False)
    observation = stream(observer, decoder, 1, icl=True)
    assert decoder.model_local_kv_specs() == []
    assert observation.peak_bytes == 310 * POSITION


def running_ming_talker() -> MingFlashOmniTalkerForConditionalGeneration:
    """The real talker with the real talker LLM attention geometry (bfloat16) and tiny DiT, aggregator and MLP."""
    torch.manual_seed(0)
    llm_config = Qwen2Config(
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        hidden_size=896,
        intermediate_size=128,
        vocab_size=32,
    )
    llm_config._attn_implementation = "sdpa"
    latent, patch = 64, 4
    model = Qwen2Model(llm_config).to(torch.bfloat16).eval()
    cfm = CFM(DiT(in_channels=latent, hidden_size=64, depth=1, num_heads=2, llm_cond_dim=896), steps=2)
    aggregator = Aggregator(in_channels=latent, hidden_size=64, depth=1, num_heads=2, llm_input_dim=896)
    stop_head = nn.Linear(896, 2, bias=True)
    cfm, aggregator, stop_head = (m.to(torch.bfloat16).eval() for m in (cfm, aggregator, stop_head))
    config = types.SimpleNamespace(steps=2, patch_size=patch, history_patch_size=patch, cfg_strength=2.0)
    talker = object.__new__(MingFlashOmniTalkerForConditionalGeneration)
    nn.Module.__init__(talker)
    talker.config, talker.llm_config = config, llm_config
    talker.model, talker.cfm, talker.aggregator, talker.stop_head = model, cfm, aggregator, stop_head
    talker.audio_vae, talker.hidden_size, talker.cfg_strength, talker.voice_presets = None, 896, 2.0, {}
    talker.audio_generator = MingAudioGenerator(
        config=config,
        llm_config=llm_config,
        model=model,
        cfm=cfm,
        aggregator=aggregator,
        stop_head=stop_head,
        audio_vae=None,
        patch_size=patch,
        his_patch_size=patch,
        latent_dim=latent,
        cfg_strength=2.0,
        use_cuda_graphs=False,
    )
    return talker


def test_ming_talker_holds_exactly_its_declaration_once_per_call(observer: Observer, sidecar: Sidecar) -> None:
    """A StaticCache of 2048 positions built inside generate_latents, a non-forward method of a plain delegate."""
    talker = running_ming_talker()
    snapshot = build_snapshot(talker, max_num_seqs=4, engine_id="ming-talker")
    observer.add_owners(declaring_owners(talker))
    for _ in range(2):
        with torch.no_grad():
            talker.forward(
                input_ids=torch.zeros(1, dtype=torch.long),
                positions=torch.zeros(1, dtype=torch.long),
                inputs_embeds=torch.randn(1, 12, 896, dtype=torch.bfloat16),
                runtime_additional_information=[{"max_steps": 3}],
            )
    (observation,) = observer.sample()
    assert snapshot.declared_peak_bytes == MING_ROW, "FIXED 1 row whatever max_num_seqs"
    assert observation.peak_bytes == observation.recent_peak_bytes == MING_ROW, "one cache alive at a time"
    assert observation.live_bytes == 0 and observation.calls == observation.cache_calls == 2
    write_snapshot(sidecar.spool_dir, replace(snapshot, observations=(observation,)))
    families = {f.name: f for f in Exposition(sidecar.get("/metrics").text)}
    (peak,) = families["modelkv_observed_peak_bytes"].samples
    assert peak.labels["owner"] == "(root)" and peak.value == MING_ROW


def test_the_wrong_qwen3_tts_declaration_shows_on_metrics(observer: Observer, sidecar: Sidecar) -> None:
    """What ModelKVDeclarationUnderReports compares: observed peak against the declared peak of the same owner."""
    decoder = running_decoder(1, wrapper=True)
    model = nn.Module()
    model.tokenizer = nn.Module()
    model.tokenizer.decoder = decoder
    snapshot = build_snapshot(model, max_num_seqs=1, engine_id="qwen3-tts-code2wav")
    observer.add_owners(declaring_owners(model))
    stream(observer, decoder, 1, icl=True, path="tokenizer.decoder")
    write_snapshot(sidecar.spool_dir, replace(snapshot, observations=observer.sample()))
    families = {f.name: f for f in Exposition(sidecar.get("/metrics").text)}
    declared = sum(s.value for s in families["modelkv_declared_peak_bytes"].samples)
    (observed,) = families["modelkv_observed_peak_bytes"].samples
    assert observed.labels["owner"] == "tokenizer.decoder"
    assert declared == 142 * POSITION and observed.value == 310 * POSITION


def running_mimo_local_transformer() -> MiMoAudioLLMForConditionalGeneration:
    """MiMo-Audio's LLM with only what its local decode reads: the real local transformer geometry, tiny heads."""
    torch.manual_seed(0)
    config = Qwen2Config(
        num_hidden_layers=16,
        num_attention_heads=64,
        num_key_value_heads=64,
        hidden_size=1024,
        intermediate_size=64,
        vocab_size=16,
    )
    config._attn_implementation = "sdpa"
    llm = object.__new__(MiMoAudioLLMForConditionalGeneration)
    nn.Module.__init__(llm)
    llm.local_config = config
    llm.group_size, llm.delay_pattern, llm.audio_channels = 4, [0, 1, 2, 3, 4, 5, 6, 7], 8
    llm.speech_empty_ids = [0] * 8
    llm.local_transformer = MiMoAudioQwen2Model(config).to(torch.bfloat16).eval()
    llm.local_transformer.embed_tokens = None
    heads = [nn.Linear(1024, 32, bias=False) for _ in range(8)]
    llm.local_transformer_lm_heads = nn.ModuleList(heads).to(torch.bfloat16)
    llm.speech_embeddings = nn.ModuleList([nn.Embedding(32, 1024, padding_idx=0) for _ in range(8)]).to(torch.bfloat16)
    llm.speech_embeddings_to_local = None
    llm.local_forward_cg_by_bs = {}
    return llm


def test_mimo_audio_local_transformer_holds_exactly_its_declaration(observer: Observer) -> None:
    """The eager local decode: one DynamicCache, a row per request, group_size + max(delay_pattern) positions."""
    llm = running_mimo_local_transformer()
    rows = 2
    observer.add_owners(declaring_owners(llm))
    with torch.no_grad():
        tokens = llm.local_forward(torch.randn(rows, 1, 1024, dtype=torch.bfloat16), tokens_device=torch.device("cpu"))
    assert tokens.shape == (rows, 4, 8)
    (observation,) = observer.sample()
    (spec,) = llm.model_local_kv_specs()
    assert spec.physical_capacity_positions == 11 and spec.peak_bytes(rows) == 2 * 16 * 64 * 16 * 11 * 2 * rows
    assert observation.peak_bytes == spec.peak_bytes(rows), "the declaration at max_num_seqs = rows in the call"
    assert observation.live_bytes == 0 and observation.cache_calls == 1
