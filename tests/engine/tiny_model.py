"""A tiny random Qwen2 checkpoint made locally (no hub): config, tokenizer trained offline."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "memory that models declare outside the paged kv manager",
    "prometheus scrapes the sidecar and grafana draws the gauges",
    "one two three four five six seven eight nine ten",
] * 50


def make_tiny_qwen2(directory: Path, architecture: str = "Qwen2ForCausalLM") -> Path:
    """Write config.json and a tokenizer for a 2-layer Qwen2 to ``directory``; weights come from load_format=dummy."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", "<pad>"])
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(directory)
    config = Qwen2Config(
        vocab_size=400,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
        architectures=[architecture],
    )
    config.save_pretrained(directory)
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return directory
