"""Int-keyed tables split over many small dicts, so that no single growth rehashes many entries at once.

A census records what it visits in tables that may reach hundreds of thousands of entries. One dict of that size
rehashes everything when it grows (about 10 ms at 500 000 entries, far beyond a census slice); split over
``Shards.count`` small dicts, each growth moves a few thousand entries at most. Keys and values are ints (ids,
addresses, packed figures): ints are not tracked by the collector, so no entry makes a collection come sooner.
"""

from __future__ import annotations

from collections.abc import Iterator

SHARD_ENTRIES = 2048
"""The entries a shard holds on average when the table is full (a shard's growth then moves a few thousand
entries: well under 0.1 ms)."""
MOST_SHARDS = 4093


class Shards:
    """A table of ``int -> int`` for at most about ``entries`` entries, split over small dicts by key."""

    __slots__ = ("parts", "count")

    def __init__(self, entries: int) -> None:
        self.count = min(MOST_SHARDS, max(61, entries // SHARD_ENTRIES)) | 1
        """How many dicts; odd, so that aligned keys (addresses are multiples of 16 or more) spread over all."""
        self.parts: list[dict[int, int]] = [{} for _ in range(self.count)]

    def part(self, key: int) -> dict[int, int]:
        """The dict that holds ``key``."""
        return self.parts[key % self.count]

    def get(self, key: int) -> int | None:
        """The value of ``key``; None when absent."""
        return self.parts[key % self.count].get(key)

    def __contains__(self, key: object) -> bool:
        return type(key) is int and key in self.parts[key % self.count]

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    def pop(self, key: int) -> int | None:
        """Remove ``key``; its value, or None when absent."""
        return self.parts[key % self.count].pop(key, None)

    def items(self) -> Iterator[tuple[int, int]]:
        """Every ``(key, value)``, shard by shard."""
        for part in self.parts:
            yield from part.items()

    def largest(self) -> int:
        """The entries of the fullest shard (what its next growth moves at most, by about half again)."""
        return max(len(part) for part in self.parts)
