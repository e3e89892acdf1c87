"""The spool as the sidecar sees it: one scan, every entry classified at one instant."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from modelkv_exporter.contract.scan import SpoolReader
from modelkv_exporter.contract.state import (
    DEFAULT_FORGET_AFTER_SECONDS,
    DEFAULT_STALE_AFTER_SECONDS,
    SpoolView,
    classify,
)


@dataclass
class SpoolSource:
    """A spool reader, the staleness and forgetting thresholds and the clock: everything a view of the spool needs.

    The last classification is reused while the reader returns the same scan and no engine's
    deadline has passed (``SpoolView.until``: going stale, or being forgotten): a scrape of an
    unchanged spool classifies nothing.
    """

    reader: SpoolReader
    stale_after: float = DEFAULT_STALE_AFTER_SECONDS
    clock: Callable[[], float] = field(default=time.time)
    forget_after: float = DEFAULT_FORGET_AFTER_SECONDS
    _last: SpoolView | None = field(default=None, init=False, repr=False)

    def view(self) -> SpoolView:
        """Scan the spool now and classify every file."""
        scan = self.reader.scan()
        now = self.clock()
        last = self._last
        if last is not None and last.scan is scan and last.now <= now <= last.until:
            view = last.at(now)
        else:
            view = classify(scan, now, self.stale_after, self.forget_after)
        self._last = view
        return view
