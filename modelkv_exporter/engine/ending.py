"""Why an engine ended, told from the exception that ended it, without running any of the exception's code.

Stdlib only: torch's ``OutOfMemoryError`` is looked up in ``sys.modules`` (a process that raised one has imported
torch). Only the exception's type and its first argument (a plain ``str``) are read, through ``BaseException``'s own
slot: a subclass's ``__str__``, ``args`` property or ``__class__`` never runs. Nothing here keeps the exception.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from modelkv_exporter.contract.vocabulary import EndReason

MAX_ERROR_CHARS = 512
"""The longest ``EndState.error`` the contract allows."""

OUT_OF_MEMORY_MESSAGE = re.compile(r"out of memory|can't allocate memory|GPU driver error 2\b", re.IGNORECASE)
"""What an out-of-memory says where it raises no type of its own: the CUDA runtime (``CUDA error: out of memory``),
torch's CPU allocator (``DefaultCPUAllocator: can't allocate memory``, a ``RuntimeError``) and vLLM 0.34's driver
mapping of its extensible KV cache (``GPU driver error 2: out of memory``: ``CUDA_ERROR_OUT_OF_MEMORY`` and
``hipErrorOutOfMemory`` are both 2)."""


_ARGS: Any = BaseException.__dict__["args"]
"""``BaseException``'s own ``args`` slot, read past whatever a subclass defines under that name."""


def _first_argument(error: BaseException) -> str:
    args = _ARGS.__get__(error, BaseException)
    first = args[0] if args else None
    return first if type(first) is str else ""


def _torch_out_of_memory() -> type | None:
    found = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    return found if isinstance(found, type) else None


def end_reason(error: BaseException) -> EndReason:
    """``out_of_memory`` for torch's ``OutOfMemoryError``, Python's ``MemoryError`` and a ``RuntimeError`` whose
    message says it ran out of memory; ``error`` for any other exception."""
    kind = type(error)
    torch_oom = _torch_out_of_memory()
    if issubclass(kind, MemoryError) or (torch_oom is not None and issubclass(kind, torch_oom)):
        return EndReason.OUT_OF_MEMORY
    if issubclass(kind, RuntimeError) and OUT_OF_MEMORY_MESSAGE.search(_first_argument(error)):
        return EndReason.OUT_OF_MEMORY
    return EndReason.ERROR


def error_line(error: BaseException) -> str:
    """The exception's qualified type and the first line of its message, at most ``MAX_ERROR_CHARS`` characters
    (``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. ...``)."""
    kind = type(error)
    module = kind.__module__ if type(kind.__module__) is str else ""
    name = kind.__qualname__ if module in ("", "builtins") else f"{module}.{kind.__qualname__}"
    lines = _first_argument(error).strip().splitlines()
    line = f"{name}: {lines[0]}" if lines else name
    return line[:MAX_ERROR_CHARS]
