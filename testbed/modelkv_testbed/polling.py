"""The one way tests wait: poll a condition until it holds, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.05) -> T:
    """Call ``check`` until it returns something truthy, and return that; fail naming ``what`` after ``timeout`` s.

    An exception from ``check`` ends the wait at once: return something falsy for "not yet".
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
