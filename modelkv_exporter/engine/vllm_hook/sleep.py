"""vLLM's sleep mode: what the sleep allocator holds off the device, read from its own books after each transition.

With ``enable_sleep_mode`` vLLM allocates the weights, the paged KV cache and (0.34) the CUDA graph
pools and runtime buffers through ``CuMemAllocator``, a torch memory pool whose pages it maps with the
driver; ``Worker.sleep`` unmaps them (level 1 backs the weights up to host memory first, level 2
discards them), ``wake_up(tags)`` maps the named tags again, and vLLM 0.34's ``discard(tags)`` drops
some without a sleep. Torch's figures do not move through any of it (the pool's segments stay
reserved, its tensors allocated); NVML's do.

The allocator keeps one record per allocation (``pointer_to_data``: ``handle[1]`` its bytes, ``tag``,
``is_asleep``) in vLLM 0.30 to 0.34. The hook reads those plain fields once after each ``sleep``,
``wake_up`` and ``discard`` returns, on the thread that called it, from the allocator vLLM already
made (never creating one), and publishes the bytes held off the device by tag. No tensor or
allocator is kept.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from modelkv_exporter.contract.fields import PLAIN_NAME

ALLOCATOR_MODULE = "vllm.device_allocator.cumem"
OTHER_TAG = "other"
"""Where bytes of a tag that is no plain name (``contract.fields.PLAIN_NAME``) are counted."""
_PLAIN = re.compile(PLAIN_NAME)


def sleep_allocator() -> Any | None:
    """vLLM's ``CuMemAllocator`` where this process made one, else None (nothing is imported or created)."""
    module = sys.modules.get(ALLOCATOR_MODULE)
    allocator_class = getattr(module, "CuMemAllocator", None)
    return getattr(allocator_class, "instance", None)


def released_bytes(allocator: Any | None) -> dict[str, int] | None:
    """Bytes ``allocator`` holds off the device now, by tag; None when its books cannot be read."""
    if allocator is None:
        return {}
    try:
        records = list(getattr(allocator, "pointer_to_data", {}).values())
        released: dict[str, int] = {}
        for record in records:
            if getattr(record, "is_asleep", False) is True:
                size = record.handle[1]
                tag = getattr(record, "tag", None)
                if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(tag, str):
                    return None
                tag = tag if _PLAIN.fullmatch(tag) else OTHER_TAG
                released[tag] = released.get(tag, 0) + size
        return released
    except Exception:
        return None
