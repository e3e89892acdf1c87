"""Host-side memory measurements that need nothing but the standard library."""

from __future__ import annotations

import os
import time

from modelkv_exporter.snapshot import MemorySample


def process_resident_bytes(pid: int | str = "self") -> int | None:
    """Resident set size of a process from ``/proc``, or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            resident_pages = int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def sample_host_memory() -> MemorySample:
    """A sample holding what the host can tell of this process: its resident memory."""
    rss = process_resident_bytes()
    values = {} if rss is None else {"process_resident": rss}
    return MemorySample(sampled_at=time.time(), values=values)
