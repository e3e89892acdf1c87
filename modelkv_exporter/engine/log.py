"""The engine side's one logger tree, under vLLM's: lines follow vLLM's format and ``VLLM_LOGGING_LEVEL``.

Code that runs on the model's threads, or holds a lock those threads take, never logs: a logging
handler takes locks of its own (and may run anything: a slow network handler, a collection that
runs our weakref callbacks), and near the recursion limit logging itself recurses. It ``report``s
instead, which only appends to a bounded queue and never raises; the heartbeat thread ``flush``es
the queue, holding no lock of ours.
"""

from __future__ import annotations

import collections
import logging

ROOT = "vllm.modelkv_exporter"
PENDING_LIMIT = 64
"""Reports kept at most before the heartbeat logs them (the oldest are dropped beyond)."""

Report = tuple[logging.Logger, int, str, tuple[object, ...], "str | None"]
_pending: collections.deque[Report] = collections.deque(maxlen=PENDING_LIMIT)


def get_logger(part: str) -> logging.Logger:
    """The logger of one part of the engine side, e.g. ``vllm.modelkv_exporter.heartbeat``."""
    return logging.getLogger(f"{ROOT}.{part}")


def report(
    logger: logging.Logger,
    message: str,
    *args: object,
    error: BaseException | None = None,
    level: int = logging.WARNING,
) -> None:
    """Queue one line for ``flush`` to log later; safe on any thread, under any lock, at any depth. Never raises.

    Only ``error``'s type and message are kept, as text: the exception itself would keep its traceback (and
    those of the exceptions it chains), the frames in them and the tensors in their locals alive.
    """
    try:
        detail = None
        if error is not None:
            detail = type(error).__name__
            detail = f"{detail}: {error}"
    except BaseException:  # noqa: BLE001 - the message could not be formatted (at the recursion limit): its type
        pass
    try:
        _pending.append((logger, level, message, args, detail))
    except BaseException:  # noqa: BLE001 - nothing may leave the failure path, not even at the recursion limit
        pass


def flush() -> None:
    """Log every queued report (on a thread that holds no lock of ours). Never raises."""
    while True:
        try:
            logger, level, message, args, detail = _pending.popleft()
        except IndexError:
            return
        try:
            if detail is not None:
                message += ": %s"
                args = (*args, detail)
            logger.log(level, message, *args)
        except Exception:  # noqa: BLE001 - a broken handler loses the line, never the engine
            pass


def pending() -> int:
    """How many reports wait for ``flush``."""
    return len(_pending)
