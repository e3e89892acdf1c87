"""The engine side's one logger tree, under vLLM's: lines follow vLLM's format and ``VLLM_LOGGING_LEVEL``.

Code that runs on the model's threads, or holds a lock those threads take, never logs: a logging
handler takes locks of its own (and may run anything: a slow network handler, a collection that
runs our weakref callbacks), and near the recursion limit logging itself recurses. It ``report``s
instead, which only appends to a bounded queue and never raises an exception of ours; the heartbeat
thread ``flush``es the queue, holding no lock of ours.

Nothing here catches ``BaseException`` on a thread that is not ours: a ``KeyboardInterrupt`` or
``SystemExit`` delivered asynchronously to the model's thread (a signal, ``PyThreadState_SetAsyncExc``)
while our code runs there passes through unchanged, as it would with the hook off.
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
    """Queue one line for ``flush`` to log later; safe on any thread, under any lock, at any depth. Never raises an
    exception of its own (an asynchronous ``KeyboardInterrupt`` or ``SystemExit`` that arrives meanwhile passes).

    Only ``error``'s type and message are kept, as text: the exception itself would keep its traceback (and
    those of the exceptions it chains), the frames in them and the tensors in their locals alive.
    """
    detail = None
    try:
        if error is not None:
            detail = type(error).__name__
            detail = f"{detail}: {error}"
    except Exception:  # noqa: BLE001 - the message could not be formatted (at the recursion limit): its type
        pass
    try:
        _pending.append((logger, level, message, args, detail))
    except Exception:  # noqa: BLE001 - nothing of ours leaves the failure path, not even at the recursion limit
        pass


def flush(*, own_thread: bool = False) -> str | None:
    """Log every queued report (on a thread that holds no lock of ours). A handler's exception loses its line.

    On a thread of ours (``own_thread``: the heartbeat's, or the one ``SnapshotPublisher.stop`` starts), a handler's
    ``SystemExit`` or ``KeyboardInterrupt`` is the handler's and loses its line too, and what the first such handler
    raised is returned ("SystemExit: 3"); on any other thread they pass (they may be the model's, delivered
    asynchronously), with the lines not yet logged kept for the next flush.
    """
    escaped = None
    while True:
        try:
            logger, level, message, args, detail = _pending.popleft()
        except IndexError:
            return escaped
        try:
            if detail is not None:
                message += ": %s"
                args = (*args, detail)
            logger.log(level, message, *args)
        except Exception:  # noqa: BLE001 - a broken handler loses the line, never the engine
            pass
        except BaseException as error:
            if not own_thread:
                raise
            if escaped is None:
                escaped = type(error).__name__
                try:
                    escaped = f"{escaped}: {error}"
                except Exception:  # noqa: BLE001 - its type says enough
                    pass


def pending() -> int:
    """How many reports wait for ``flush``."""
    return len(_pending)
