"""The sidecar's one logger tree, ``modelkv_exporter.*``, and the rate limit every sidecar line goes through.

A hostile client or file can cause the same line thousands of times a second; the limit lets a
burst of each message through, then one a second, and says how many were suppressed. Errors
always pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

ROOT = "modelkv_exporter"
BURST = 5
PER_SECOND = 1.0
MAX_MESSAGES = 1000
"""Distinct message templates tracked at once; beyond that the table starts over (bounded memory)."""


class RateLimit(logging.Filter):
    """A token bucket per (level, message template): ``burst`` lines at once, then ``per_second``.

    The first line let through after some were dropped ends with "(N similar lines suppressed)".
    """

    def __init__(
        self, burst: int = BURST, per_second: float = PER_SECOND, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.burst = float(burst)
        self.per_second = per_second
        self.clock = clock
        self._buckets: dict[tuple[int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is let through; one let through after a suppression says how many were dropped."""
        if record.levelno >= logging.ERROR:
            return True
        now = self.clock()
        key = (record.levelno, str(record.msg))
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_MESSAGES:
                self._buckets.clear()
            bucket = self._buckets[key] = [self.burst, now, 0.0]
        tokens, last, dropped = bucket
        tokens = min(self.burst, tokens + (now - last) * self.per_second)
        if tokens < 1.0:
            bucket[:] = [tokens, now, dropped + 1]
            return False
        bucket[:] = [tokens - 1.0, now, 0.0]
        if dropped:
            record.msg = f"{record.getMessage()} ({int(dropped)} similar lines suppressed)"
            record.args = None
        return True


RATE_LIMIT = RateLimit()
"""The one rate limit of this process's sidecar and uvicorn lines."""


def limit(logger: logging.Logger) -> logging.Logger:
    """``logger`` with the process's rate limit on it (a logger's filters see only its own records)."""
    if RATE_LIMIT not in logger.filters:
        logger.addFilter(RATE_LIMIT)
    return logger


def get_logger(part: str) -> logging.Logger:
    """The rate-limited logger of one part of the sidecar, e.g. ``modelkv_exporter.spool``."""
    return limit(logging.getLogger(f"{ROOT}.{part}"))
