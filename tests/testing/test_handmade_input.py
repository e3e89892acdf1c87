"""Issue 47's bad input, on the hand-made caches: a string dtype is ``invalid field dtype`` (no traceback), a
misspelled declaring method is named, and once an invalid spec is dropped no surviving spec's field is blamed.

On main (3896f48) the string dtype logged ``TypeError: empty(): argument 'dtype' must be torch.dtype`` with its
traceback, ``model_local_kv_spec`` passed unnoticed ("declares nothing and held nothing" or undeclared), and the
surviving spec of the cross-attention owner was blamed for ``physical_capacity_positions``.
"""

from __future__ import annotations

import logging

import pytest
import torch

from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, OwnedSpec, near_misses
from modelkv_exporter.engine.resolve import resolve_owned
from modelkv_exporter.testing import check
from tests.testing.handmade import DECODED, ENCODED, CrossAttention, StaticRing, declare, drive

MAX_NUM_SEQS = 3


def test_a_string_dtype_is_an_invalid_field_dtype_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        declarations, dropped = resolve_owned([OwnedSpec("", "Ring", declare(dtype="float32"))], MAX_NUM_SEQS)
    assert declarations == () and len(dropped) == 1
    assert dropped[0].error.startswith("InvalidDeclaration: invalid field dtype: must be a torch.dtype"), dropped
    assert "'float32'" in dropped[0].error
    assert caplog.records and not any(record.exc_info for record in caplog.records), "no traceback is logged"
    report = check(
        StaticRing([declare(dtype="float32")], MAX_NUM_SEQS), drive, max_num_seqs=MAX_NUM_SEQS, batches=(1, 3)
    )
    assert not report.ok
    assert "invalid field dtype" in report.failures[0]


class MisspelledRing(torch.nn.Module):
    """The ring, declared through a method the engine never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.ring = StaticRing([], MAX_NUM_SEQS)

    def model_local_kv_spec(self) -> list[ModelLocalKVSpec]:
        return [declare()]

    def forward(self, size: int) -> None:
        self.ring(size)


class Parent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ring = MisspelledRing()

    def forward(self, size: int) -> None:
        self.ring(size)


def test_a_near_miss_method_name_is_named() -> None:
    assert near_misses(Parent()) == [("ring", "MisspelledRing", "model_local_kv_spec")]
    assert near_misses(StaticRing([declare()], MAX_NUM_SEQS)) == [], "the right name is no near miss"
    report = check(Parent(), drive, max_num_seqs=MAX_NUM_SEQS, batches=(1, 3))
    assert not report.ok
    assert report.failures[0] == (
        "'ring' (MisspelledRing): defines model_local_kv_spec(), not model_local_kv_specs(): the engine never calls "
        "it, so nothing is declared"
    )
    with pytest.raises(AssertionError, match=r"defines model_local_kv_spec\(\), not model_local_kv_specs\(\)"):
        report.assert_ok()


def test_after_a_spec_is_dropped_no_surviving_spec_is_blamed() -> None:
    """Self-attention declared right, cross-attention with a string dtype (dropped): the drop fails the check, and
    the surviving spec is not blamed for the positions the dropped one would have declared."""
    specs = [
        declare(name="self_attention", physical_capacity_positions=DECODED, scope=ModelLocalKVScope.REQUEST),
        declare(name="cross_attention", physical_capacity_positions=ENCODED, dtype="float32"),
    ]
    report = check(CrossAttention(specs, MAX_NUM_SEQS), drive, max_num_seqs=MAX_NUM_SEQS, batches=(1, 3))
    owner = report.owner("")
    assert [d.name for d in owner.declarations] == ["self_attention"]
    assert owner.problems == (), report.text()
    assert "wrong field" not in report.text()
    assert not report.ok and "invalid field dtype" in report.failures[0]
    right = [
        specs[0],
        declare(name="cross_attention", physical_capacity_positions=ENCODED, scope=ModelLocalKVScope.REQUEST),
    ]
    check(CrossAttention(right, MAX_NUM_SEQS), drive, max_num_seqs=MAX_NUM_SEQS, batches=(1, 3)).assert_ok()
