"""The engine side's one logger tree, under vLLM's: lines follow vLLM's format and ``VLLM_LOGGING_LEVEL``."""

from __future__ import annotations

import logging

ROOT = "vllm.modelkv_exporter"


def get_logger(part: str) -> logging.Logger:
    """The logger of one part of the engine side, e.g. ``vllm.modelkv_exporter.heartbeat``."""
    return logging.getLogger(f"{ROOT}.{part}")
