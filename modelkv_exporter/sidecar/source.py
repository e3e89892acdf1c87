"""The spool as the sidecar sees it: one scan, admitted within the budget, every entry classified at one instant."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.sidecar.budget import Admission, Budget
from modelkv_exporter.sidecar.reader.scan import SpoolLimits, SpoolReader, SpoolScan
from modelkv_exporter.sidecar.reader.state import Classified, SpoolView, Staleness, classify, spool_liveness
from modelkv_exporter.sidecar.sidecar_log import get_logger

LOG = get_logger("spool")


@dataclass
class SpoolSource:
    """A spool reader, its admission, the staleness and forgetting thresholds and the clock: everything a view
    of the spool needs.

    The last classification is reused while the reader returns the same scan, no engine's
    deadline has passed (``SpoolView.until``: going stale, being forgotten, or a heartbeat from the
    future coming due) and every stale engine's liveness lock reads as before (one open and flock per
    stale file per view: a process killed while its file stays unchanged shows as vanished at the next
    view): a scrape of an unchanged spool with no stale engine classifies nothing. What HTTP clients are
    not told is logged: why the spool cannot be listed (once per change) and why each file version
    was rejected (once per version), OS errors included.
    """

    reader: SpoolReader
    stale_after: float = Staleness.stale_after
    clock: Callable[[], float] = field(default=time.time)
    admission: Admission | None = None
    forget_after: float = Staleness.forget_after
    _last: SpoolView | None = field(default=None, init=False, repr=False)
    _logged: set[tuple[str, int]] = field(default_factory=set, repr=False)
    _listing_error: str | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def budgeted(
        cls,
        directory: Path,
        *,
        budget: Budget,
        reading: SpoolLimits | None = None,
        staleness: Staleness | None = None,
        clock: Callable[[], float] = time.time,
    ) -> SpoolSource:
        """A source over ``directory`` read within ``reading``, whose reader checks each snapshot against ``budget``
        as it parses it; ``staleness`` is when its engines go stale and are forgotten (the defaults when None)."""
        admission = Admission(budget)
        reader = (reading or SpoolLimits()).reader(directory, admit=admission.check)
        staleness = staleness or Staleness()
        return cls(reader, staleness.stale_after, clock, admission, staleness.forget_after)

    @property
    def budget(self) -> Budget:
        """The budget the spool is admitted within (the defaults for a source without admission)."""
        return Budget() if self.admission is None else self.admission.budget

    def view(self) -> SpoolView:
        """Scan the spool now, admit it within the budget, and classify every file."""
        scan = self.reader.scan()
        if self.admission is not None:
            scan = self.admission.admit(scan, self.reader)
        now = self.clock()
        last = self._last
        read: dict[str, bool | None] = {}
        ask = spool_liveness(self.reader.directory)

        def alive(snapshot: Snapshot) -> bool | None:
            engine_id = snapshot.engine.engine_id
            if engine_id not in read:
                read[engine_id] = ask(snapshot)
            return read[engine_id]

        if (
            last is not None
            and last.scan is scan
            and last.now <= now <= last.until
            and all(alive(item.snapshot) is answer for item, answer in self._stale_liveness(last))
        ):
            view = last.at(now)
        else:
            if last is None or last.scan is not scan:
                self._log(scan)
            view = classify(scan, now, self.stale_after, self.forget_after, alive)
        self._last = view
        return view

    @staticmethod
    def _stale_liveness(view: SpoolView) -> list[tuple[Classified, bool | None]]:
        answers = dict(view.liveness)
        return [(item, answers[item.entry.file_name]) for item in view.entries if item.entry.file_name in answers]

    def _log(self, scan: SpoolScan) -> None:
        with self._lock:
            if scan.error is not None and scan.error != self._listing_error:
                LOG.warning("cannot list the spool: %s", scan.error)
            self._listing_error = scan.error
            rejected = {(e.file_name, e.version): e.error for e in scan.entries if e.error is not None}
            for key, error in rejected.items():
                if key not in self._logged:
                    LOG.warning("spool file %r rejected (%s): %s", key[0], error.reason.value, error.detail)
            self._logged = set(rejected)
