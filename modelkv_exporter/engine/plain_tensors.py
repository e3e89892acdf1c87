"""Plain tensors a declaring owner holds count for it: one rule whether it declares caches or not.

The census finds the tensors a module holds that it did not hold after load and that no observed cache layer holds
(``discover.census``): for a module that declares nothing they are a discovered owner (``census``); for a declaring
owner they are part of the caches it declares (a ring of plain key/value tensors), so ``attribute_plain`` folds
them into its observation, each storage once, and publishes them nowhere else. Stdlib and ``contract`` only: the
heartbeat applies it to every beat, the author's check to its run (``modelkv_exporter.testing``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from modelkv_exporter.contract.snapshot import DiscoveredOwner, Observation
from modelkv_exporter.contract.vocabulary import DiscoveryMethod


def attribute_plain(
    observations: Sequence[Observation], discovered: Sequence[DiscoveredOwner], also: Collection[str] = ()
) -> tuple[tuple[Observation, ...], tuple[DiscoveredOwner, ...]]:
    """``observations`` with each declaring owner's census find added (``plain_bytes``), and ``discovered`` without it.

    ``also``: paths of owners that declare nothing whose finds are added too (the author's check reports the owners
    it was named as one figure; an engine publishes an observed owner that declares nothing as discovered, its
    layers and its plain tensors each by their method). A census find on an owner whose caches cannot be observed
    stays discovered (there is no figure to add it to). ``cache_calls`` 0 becomes None where plain tensors were
    added: which calls write them is not seen.
    """
    census = {
        found.owner: found
        for found in discovered
        if found.found_by == DiscoveryMethod.CENSUS.value and (found.declares or found.owner in also)
    }
    merged: list[Observation] = []
    taken: set[str] = set()
    for observation in observations:
        found = census.get(observation.owner)
        if found is None or not observation.available or observation.peak_bytes is None:
            merged.append(observation)
            continue
        taken.add(observation.owner)
        merged.append(
            replace(
                observation,
                peak_bytes=observation.peak_bytes + found.peak_bytes,
                recent_peak_bytes=(observation.recent_peak_bytes or 0) + found.recent_peak_bytes,
                live_bytes=(observation.live_bytes or 0) + found.live_bytes,
                cache_calls=None if observation.cache_calls == 0 else observation.cache_calls,
                plain_bytes=found.peak_bytes,
            )
        )
    kept = tuple(f for f in discovered if not (f.found_by == DiscoveryMethod.CENSUS.value and f.owner in taken))
    return tuple(merged), kept
