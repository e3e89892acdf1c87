"""Issue 47: the ring of plain tensors gets a suggestion as the layer classes do, and holds pasted at 1, 8 and 64.

On main (dec3b54) plain tensors an owner holds were judged by their bytes alone: no suggestion, so the issue's "the
suggestion, pasted, holds at 1, 8 and 64" did not hold for that pattern. Now the check reads the key/value layout
of the plain tensors where there is one (4-dimensional keys and values of one shape, holding every byte found);
where there is none it says so plainly: bytes only.
"""

from __future__ import annotations

import pytest
import torch

from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver
from modelkv_exporter.judging.verdicts import VerdictKind
from modelkv_exporter.testing import check
from modelkv_exporter.testing.report import Report
from tests.testing.handmade import HEAD_DIM, HEADS, LAYERS, WINDOW, Declaring, PlainRing, declare, drive
from tests.testing.test_handmade_caches import MADE_AT, PASTED_AT, pasted


def run(owner: torch.nn.Module, max_num_seqs: int) -> Report:
    return check(owner, drive, max_num_seqs=max_num_seqs, batches=(1, max_num_seqs) if max_num_seqs > 1 else (1,))


class FlatSlots(Declaring):
    """Keys and values of every layer flattened into one 2-D buffer a row: no key/value layout to read."""

    def __init__(self, specs: list[ModelLocalKVSpec], max_num_seqs: int) -> None:
        super().__init__(specs, max_num_seqs)
        self.slots: torch.Tensor | None = None

    def forward(self, size: int) -> None:
        if self.slots is None:
            self.slots = torch.zeros(self.max_num_seqs, 2 * LAYERS * HEADS * WINDOW * HEAD_DIM)
        self.slots[:size] = 1.0


def test_the_plain_ring_suggestion_is_max_num_seqs_and_names_its_geometry() -> None:
    made = run(PlainRing([], MADE_AT), MADE_AT).owner("")
    (suggestion,) = made.suggestions
    for line in (
        f"layers={LAYERS},",
        f"kv_heads={HEADS},",
        f"head_dim={HEAD_DIM},",
        "dtype=torch.float32,",
        f"physical_capacity_positions={WINDOW},",
        "rows=RowDriver.MAX_NUM_SEQS,",
    ):
        assert line in suggestion.code, suggestion.code
    assert "plain tensors" in made.text()


@pytest.mark.parametrize("max_num_seqs", PASTED_AT)
def test_the_plain_ring_suggestion_pasted_holds(max_num_seqs: int) -> None:
    made = run(PlainRing([], MADE_AT), MADE_AT).owner("")
    specs = [pasted(suggestion.code, ModelLocalKVScope.MODEL) for suggestion in made.suggestions]
    assert specs and all(spec.rows is RowDriver.MAX_NUM_SEQS for spec in specs), made.text()
    report = run(PlainRing(specs, max_num_seqs), max_num_seqs)
    assert report.owner("").verdict.kind is VerdictKind.HOLDS, report.text()
    report.assert_ok()


def test_plain_tensors_without_a_key_value_layout_are_judged_by_their_bytes_only() -> None:
    exact = [declare(rows=RowDriver.MAX_NUM_SEQS)]
    held = run(FlatSlots(exact, MADE_AT), MADE_AT).owner("")
    assert held.verdict.kind is VerdictKind.HOLDS, held.text()
    bare = run(FlatSlots([], MADE_AT), MADE_AT).owner("")
    assert bare.verdict.kind is VerdictKind.UNDECLARED and not bare.suggestions
    assert "bytes only" in bare.text() and "no key/value layout" in bare.text(), bare.text()
