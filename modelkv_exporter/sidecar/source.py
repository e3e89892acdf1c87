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
    """A spool reader, the staleness and forgetting thresholds and the clock: everything a view of the spool needs."""

    reader: SpoolReader
    stale_after: float = DEFAULT_STALE_AFTER_SECONDS
    clock: Callable[[], float] = field(default=time.time)
    forget_after: float = DEFAULT_FORGET_AFTER_SECONDS

    def view(self) -> SpoolView:
        """Scan the spool now and classify every file."""
        return classify(self.reader.scan(), self.clock(), self.stale_after, self.forget_after)
