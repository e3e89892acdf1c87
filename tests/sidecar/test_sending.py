"""Bodies held by unfinished responses: shared ones counted once, the oldest responses cut past the limit."""

from __future__ import annotations

import collections

from modelkv_exporter.sidecar.http.sending import HeldBodies


def test_shared_bodies_count_once_and_the_oldest_holders_are_cut_past_the_limit() -> None:
    refusals: collections.Counter[str] = collections.Counter()
    held = HeldBodies(max_bytes=10, refusals=refusals)
    cut: list[str] = []
    version_1, version_2, version_3 = b"a" * 4, b"b" * 4, b"c" * 4
    first = held.hold((version_1,), lambda: cut.append("first"))
    held.hold((version_1,), lambda: cut.append("same version"))
    held.hold((version_2,), lambda: cut.append("second"))
    assert held.held_bytes() == 8 and cut == [], "a body shared by two responses is held once"
    held.hold((version_3,), lambda: cut.append("third"))
    assert cut == ["first", "same version"], "the oldest responses cut until the rest fit"
    assert refusals["unsent_bytes"] == 2
    held.release(first)
    assert held.held_bytes(counting_cut=False) == 8


def test_a_response_without_a_way_to_cut_it_is_never_cut() -> None:
    held = HeldBodies(max_bytes=1, refusals=collections.Counter())
    ticket = held.hold((b"xx",), None)
    held.hold((b"yy",), None)
    assert held.held_bytes() == 4
    held.release(ticket)
    assert held.held_bytes() == 2
