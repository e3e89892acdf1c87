"""Discovery on the real vLLM-Omni Qwen3-TTS tokenizer decoder, on its eager path without its CUDA-graph wrapper.

It declares nothing there, and its caches are built deep inside its transformer: the decoder is found at its own
path with the exact bytes its caches hold, and following a cache outward is broken on purpose to show the caches
split among its attention layers. Apart from ``test_discovery.py`` because it needs vLLM-Omni, which the version
matrix's second environment does not have.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from modelkv_exporter.engine.discover import Discovery, module_map
from modelkv_exporter.engine.observe import Observer
from modelkv_exporter.engine.protocol import declaring_owners
from tests.engine.test_discovery import EVERYTHING, beat, by_owner
from tests.engine.test_vllm_omni_declarers import POSITION, WINDOW, running_decoder


def test_the_real_qwen3_tts_decoder_without_its_wrapper_is_discovered_at_its_path_with_its_exact_bytes(
    observer: Observer,
) -> None:
    """Not observed as a declarer here: its layers are built deep inside its transformer, and followed outward."""
    root = nn.Module()
    root.tokenizer = nn.Module()
    root.tokenizer.decoder = decoder = running_decoder(1, wrapper=False)
    found = Discovery(root, EVERYTHING, observer=observer)
    found.start()
    try:
        request = drive_decoder(decoder)
        got = beat(found)
    finally:
        found.uninstall()
    owner = got[("tokenizer.decoder", "cache_layer")]
    assert decoder.model_local_kv_specs() == []
    assert owner.peak_bytes == 310 * POSITION, "retained 71 + batched 71 + working 71 + 97 new frames a row"
    assert owner.live_bytes == 71 * POSITION, "between steps: the retained request cache"
    del request[0]["past_key_values"]
    released = beat(found)[("tokenizer.decoder", "cache_layer")]
    assert (released.live_bytes, released.peak_bytes) == (0, 310 * POSITION), "released: it leaves the live figure"
    assert [key for key in got if key[1] == "cache_layer"] == [("tokenizer.decoder", "cache_layer")]
    assert owner.layout is not None
    assert (owner.layout.layers, owner.layout.kv_heads, owner.layout.head_dim) == (8, 16, 64)


def test_the_decoder_observed_as_an_owner_that_declares_nothing_is_a_discovered_owner(observer: Observer) -> None:
    """In the engine the decoder is observed (it has the declarer method); declaring nothing makes it discovered."""
    root = nn.Module()
    root.tokenizer = nn.Module()
    root.tokenizer.decoder = decoder = running_decoder(1, wrapper=False)
    observer.add_owners(declaring_owners(root))
    found = Discovery(root, EVERYTHING, observer=observer, declaring=())
    found.start()
    try:
        request = drive_decoder(decoder)
        found.census()
        published, _ = found.sample(observer.sample())
    finally:
        found.uninstall()
    owner = by_owner(published)[("tokenizer.decoder", "cache_layer")]
    assert (owner.peak_bytes, owner.live_bytes, owner.declares) == (310 * POSITION, 71 * POSITION, False)
    assert request[0]["past_key_values"] is not None, "the retained cache the live bytes are"


def drive_decoder(decoder: nn.Module, steps: int = 6) -> list[dict[str, Any]]:
    """ICL mode, one row: the reference prefix and a frame, then 25 frames a step (as Qwen3TTSCode2Wav).

    Returns the request's state, which keeps its retained cache between steps.
    """
    states = [{"prefix_frames": WINDOW}]
    for step in range(steps):
        new = WINDOW + 1 if step == 0 else 25
        with torch.no_grad():
            decoder.batched_chunked_decode(
                torch.randint(0, 64, (1, 4, new)),
                [new],
                caches=states,
                chunk_size=300,
                left_context_size=25,
                max_batch_size=0,
            )
    return states


def test_without_following_the_cache_outward_the_decoder_is_split_into_its_attention_layers(
    observer: Observer, monkeypatch
) -> None:
    monkeypatch.setattr(module_map, "takes_cache", lambda code: False)
    root = nn.Module()
    root.decoder = decoder = running_decoder(1, wrapper=False)
    found = Discovery(root, EVERYTHING, observer=observer)
    found.start()
    try:
        drive_decoder(decoder)
        got = beat(found)
    finally:
        found.uninstall()
    assert got[("decoder.pre_transformer", "cache_layer")].peak_bytes == 72 * POSITION, "the prefix cache it built"
