"""Cache owners with the geometries of vLLM-Omni 0.30.0's known declarers, holding real caches.

Each owner declares its caches through our protocol *and* can allocate them as
real ``transformers`` cache objects built from the same config, so the demo's
process really holds what it declares and the tests can weigh the tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import (
    Cache,
    DynamicCache,
    EncoderDecoderCache,
    PretrainedConfig,
    Qwen2Config,
    StaticCache,
    WhisperConfig,
)

from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver, spec_from_hf_config


def cache_bytes(cache: Cache) -> int:
    """Bytes a transformers cache keeps allocated: the distinct storages behind its keys and values.

    Storages, not ``numel * element_size``: a sliding-window layer keeps a ``window - 1`` view into a
    larger tensor, and the whole tensor stays allocated.
    """
    layers = (
        [*cache.self_attention_cache.layers, *cache.cross_attention_cache.layers]
        if isinstance(cache, EncoderDecoderCache)
        else cache.layers
    )
    storages: dict[int, int] = {}
    for layer in layers:
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                storages[storage.data_ptr() or id(tensor)] = storage.nbytes()
    return sum(storages.values())


def _fill(cache: Cache, spec: ModelLocalKVSpec, rows: int, tokens: int) -> Cache:
    """Prefill ``tokens`` positions of ``rows`` batch rows into each of ``spec``'s layers, keys and values distinct."""
    shape = (rows, spec.kv_heads, tokens, spec.head_dim)
    for layer in range(spec.layers):
        keys, values = torch.full(shape, 0.5, dtype=spec.dtype), torch.full(shape, -0.5, dtype=spec.dtype)
        cache.update(keys, values, layer, cache_kwargs={"cache_position": torch.arange(tokens)})
    return cache


class DemoOwner(nn.Module):
    """An owner of model-local KV: it declares specs and can allocate them for real."""

    def __init__(self, config: PretrainedConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.anchor = nn.Parameter(torch.zeros(1, dtype=dtype), requires_grad=False)
        self.caches: dict[str, list[Cache]] = {}

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the caches take: the parameters' (as the real declarers read it)."""
        return self.anchor.dtype

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        """Every KV allocation this owner holds."""
        raise NotImplementedError

    def build_cache(self, spec: ModelLocalKVSpec, rows: int) -> Cache:
        """A real transformers cache for ``spec`` with ``rows`` batch rows."""
        raise NotImplementedError

    def allocate(self, max_num_seqs: int) -> None:
        """Allocate every declared cache at its resolved row count."""
        for spec in self.model_local_kv_specs():
            self.caches[spec.name] = [self.build_cache(spec, spec.row_count(max_num_seqs))]

    def held_bytes(self) -> dict[str, int]:
        """Bytes of the caches this owner really holds, by declaration name."""
        return {name: sum(cache_bytes(c) for c in caches) for name, caches in self.caches.items()}


class CodecDecoder(DemoOwner):
    """Qwen3-TTS tokenizer decoder in async-chunk mode: sliding-window DynamicCache, float32."""

    CAPTURED_BATCH_SIZES = (1, 2, 4)

    def __init__(self) -> None:
        config = Qwen2Config(
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=16,
            hidden_size=1024,
            sliding_window=72,
            use_sliding_window=True,
            layer_types=["sliding_attention"] * 8,
        )
        super().__init__(config, torch.float32)

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        window = self.config.sliding_window
        common: dict[str, Any] = dict(
            dtype=self.dtype,
            physical_capacity_positions=window - 1,
            capacity_source=f"sliding_window({window}) - 1",
        )
        return [
            spec_from_hf_config(
                self.config,
                name="codec_decoder_request",
                scope=ModelLocalKVScope.REQUEST,
                rows=RowDriver.MAX_NUM_SEQS,
                allocation_note="retained across chunks of one request",
                **common,
            ),
            spec_from_hf_config(
                self.config,
                name="codec_decoder_working_copy",
                scope=ModelLocalKVScope.INVOCATION,
                rows=RowDriver.MAX_NUM_SEQS,
                allocation_note="deep-copied from the retained cache each chunk",
                **common,
            ),
            spec_from_hf_config(
                self.config,
                name="codec_decoder_graph_pool",
                scope=ModelLocalKVScope.MODEL,
                rows=RowDriver.FIXED,
                rows_fixed=sum(self.CAPTURED_BATCH_SIZES),
                rows_reason=f"one dummy cache kept per captured batch size {self.CAPTURED_BATCH_SIZES}",
                **common,
            ),
        ]

    def build_cache(self, spec: ModelLocalKVSpec, rows: int) -> Cache:
        """A sliding-window cache holding the last ``window - 1`` positions, as vLLM-Omni keeps it between chunks.

        Its retained cache is a clone of the window (``_slice_dynamic_cache``), so its storage is
        exactly ``window - 1`` positions; a prefill of that many positions gives the same storage.
        """
        cache = DynamicCache(config=self.config)
        return _fill(cache, spec, rows, self.config.sliding_window - 1)


class EagerCodecDecoder(CodecDecoder):
    """Qwen3-TTS's decoder on its eager batched async-chunk path: a declaration that leaves a copy out, on purpose.

    It declares what vLLM-Omni 0.30.0's decoder declares there (the retained request cache and
    the working copy, no graph pool), but holds what that path holds: a third, batched copy of
    every request's cache beside them (``_batch_dynamic_caches``). Its declaration under-reports
    by half, so ``ModelKVDeclarationUnderReports`` fires for it. The real decoder under-reports
    that path by 2.18x (docs/observed-caches.md).
    """

    UNDECLARED = "batched_copy (undeclared)"

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        return [spec for spec in super().model_local_kv_specs() if spec.rows == RowDriver.MAX_NUM_SEQS]

    def allocate(self, max_num_seqs: int) -> None:
        """The declared caches, and the batched copy the declaration leaves out."""
        super().allocate(max_num_seqs)
        request = self.model_local_kv_specs()[0]
        self.caches[self.UNDECLARED] = [self.build_cache(request, max_num_seqs)]


class StaticCacheOwner(DemoOwner):
    """An owner whose caches are StaticCaches of exactly the declared capacity (allocated on first write)."""

    def build_cache(self, spec: ModelLocalKVSpec, rows: int) -> Cache:
        cache = StaticCache(config=self.config, max_cache_len=spec.physical_capacity_positions)
        return _fill(cache, spec, rows, 1)


class LocalTransformer(StaticCacheOwner):
    """MiMo-Audio's local transformer: a StaticCache bounded by the decode loop, bfloat16."""

    GROUP_SIZE = 4
    DELAY_PATTERN = (0, 1, 2, 3, 4, 5, 6, 7)
    CAPTURED_BATCH_SIZES = (1, 2, 4, 8)

    def __init__(self) -> None:
        config = Qwen2Config(num_hidden_layers=16, num_attention_heads=64, num_key_value_heads=64, hidden_size=1024)
        super().__init__(config, torch.bfloat16)

    @property
    def decode_steps(self) -> int:
        """group_size + max(delay_pattern)."""
        return self.GROUP_SIZE + max(self.DELAY_PATTERN)

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        bound = f"group_size({self.GROUP_SIZE}) + max(delay_pattern)({max(self.DELAY_PATTERN)})"
        common: dict[str, Any] = dict(
            dtype=self.dtype, physical_capacity_positions=self.decode_steps, capacity_source=bound
        )
        return [
            spec_from_hf_config(
                self.config,
                name="local_transformer",
                scope=ModelLocalKVScope.INVOCATION,
                rows=RowDriver.MAX_NUM_SEQS,
                allocation_note="one batched allocation per eager call",
                **common,
            ),
            spec_from_hf_config(
                self.config,
                name="local_transformer_graph_pool",
                scope=ModelLocalKVScope.MODEL,
                rows=RowDriver.FIXED,
                rows_fixed=sum(self.CAPTURED_BATCH_SIZES),
                rows_reason=f"sum of captured batch sizes {self.CAPTURED_BATCH_SIZES}",
                **common,
            ),
        ]


class WhisperStreamingEncoder(DemoOwner):
    """MiniCPM-o's streaming Whisper encoder: self-attention KV of an EncoderDecoderCache, bfloat16."""

    def __init__(self) -> None:
        config = WhisperConfig(encoder_layers=24, d_model=1024, encoder_attention_heads=16, max_source_positions=1500)
        super().__init__(config, torch.bfloat16)

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        positions = self.config.max_source_positions
        return [
            spec_from_hf_config(
                self.config,
                name="whisper_encoder_self_attn",
                dtype=self.dtype,
                physical_capacity_positions=positions,
                capacity_source=f"embed_positions rows = {positions}",
                scope=ModelLocalKVScope.SESSION,
                rows=RowDriver.FIXED,
                rows_fixed=1,
                rows_reason="one streaming session per worker (duplex_max_sessions = 1)",
            )
        ]

    def build_cache(self, spec: ModelLocalKVSpec, rows: int) -> Cache:
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        _fill(cache.self_attention_cache, spec, rows, spec.physical_capacity_positions)
        return cache


class TalkerGenerator(StaticCacheOwner):
    """Ming-flash-omni's talker: a StaticCache of a hard-coded 2048 positions, one row, bfloat16."""

    STATIC_CACHE_LEN = 2048

    def __init__(self) -> None:
        config = Qwen2Config(num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, hidden_size=896)
        super().__init__(config, torch.bfloat16)

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        return [
            spec_from_hf_config(
                self.config,
                name="talker_llm_static_cache",
                dtype=self.dtype,
                physical_capacity_positions=self.STATIC_CACHE_LEN,
                capacity_source=f"hardcoded max_cache_len={self.STATIC_CACHE_LEN} in _init_kv_cache",
                scope=ModelLocalKVScope.INVOCATION,
                rows=RowDriver.FIXED,
                rows_fixed=1,
                rows_reason="forward() handles one request and runs the AR loop inline",
                allocation_note="full extent on first write per layer; rebuilt per text segment",
            )
        ]


class StreamingAudioKVCache(nn.Module):
    """MiniCPM-o's streaming audio encoder as newer vLLM-Omni keeps it: its own paged KV, declared nowhere.

    One plain tensor ``[layers, 2, capacity, embed_dim]`` (no ``transformers`` class), grown
    ``PAGE`` positions at a time. It declares nothing, so only discovery's census finds it; at
    ``STREAMED`` positions it holds about 70 MiB, above ``ModelKVUndeclaredCache``'s 64 MiB.
    """

    LAYERS, EMBED_DIM, PAGE, STREAMED = 24, 1024, 250, 700

    def __init__(self) -> None:
        super().__init__()
        self.kv: torch.Tensor | None = None
        self.length = 0

    def append(self, positions: int) -> None:
        """Write ``positions`` new positions into every layer, growing the tensor by whole pages."""
        kv = self.kv
        capacity = 0 if kv is None else kv.shape[2]
        needed = self.length + positions
        if kv is None or needed > capacity:
            pages = -(-needed // self.PAGE)
            grown = torch.zeros(self.LAYERS, 2, pages * self.PAGE, self.EMBED_DIM, dtype=torch.bfloat16)
            if kv is not None:
                grown[:, :, :capacity] = kv
            self.kv = kv = grown
        kv[:, :, self.length : needed] = 0.5
        self.length = needed

    def allocate(self, max_num_seqs: int) -> None:
        """Stream ``STREAMED`` positions in chunks of 100, as audio arrives."""
        while self.length < self.STREAMED:
            self.append(100)

    def held_bytes(self) -> int:
        """Bytes of the tensor it keeps."""
        return 0 if self.kv is None else self.kv.untyped_storage().nbytes()


class LeakingStreamingKVCache(StreamingAudioKVCache):
    """The streaming encoder's cache in a model with a leak: every step streams one more page and none is ever trimmed.

    ``step`` grows it by a page (about 24 MiB of live tensors) until the next page would pass ``DEVICE_PAGES``, the
    size of the pretend device it runs on: then it raises a real ``torch.OutOfMemoryError``, as torch's allocator does
    on a full device (the demo runs on CPU, where memory would run out much later). The demo's dying engine holds one.
    """

    DEVICE_PAGES = 7
    """The demo engine's pretend device, in pages: the cache runs out of memory beyond it."""

    def step(self) -> None:
        """Stream one more page of positions, or raise ``torch.OutOfMemoryError`` when the pretend device is full."""
        needed = self.length + self.PAGE
        if -(-needed // self.PAGE) > self.DEVICE_PAGES:
            page = self.LAYERS * 2 * self.PAGE * self.EMBED_DIM * torch.bfloat16.itemsize
            held = self.held_bytes()
            raise torch.OutOfMemoryError(
                f"Tried to allocate {page / 2**20:.2f} MiB: the demo engine's {self.DEVICE_PAGES * page / 2**20:.2f} "
                f"MiB are spent ({held / 2**20:.2f} MiB held by its streaming cache, which never trims)"
            )
        self.append(self.PAGE)
