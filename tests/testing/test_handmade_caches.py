"""Issue 47: the author's check on hand-made caches (tests/testing/handmade.py), per pattern: the exact declaration
holds, a wrong field fails naming it, the suggestion pasted holds at 1, 8 and 64 sequences, a double count fails.

Each of these failed on main (3896f48): the ``StaticLayer`` ring's exact declaration failed "wrong field rows" and its
suggestion was ``FIXED``; the ``CacheLayerMixin`` ring, the int8 layer with scales and the doubling layer with its
backing buffers were "not observed (... not understood)"; the plain-tensor ring was "declared cache never used";
the writers' declarations of their parent's cache passed as "bound not reached".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver
from modelkv_exporter.testing import Report, VerdictKind, check
from tests.testing.handmade import (
    DECODED,
    ENCODED,
    HEAD_DIM,
    HEADS,
    LAYERS,
    LONGEST,
    STEPS,
    WINDOW,
    CrossAttention,
    Doubling,
    Int8Cache,
    MixinRing,
    PlainRing,
    StaticRing,
    declare,
    drive,
)

MADE_AT = 4
"""The ``max_num_seqs`` a suggestion is made at; it is pasted at ``PASTED_AT``."""
PASTED_AT = (1, 8, 64)


@dataclass(frozen=True)
class HandMade:
    """One of the issue's caches: its owner, its exact declaration, and per field a wrong one."""

    name: str
    owner: Callable[[list[ModelLocalKVSpec], int], torch.nn.Module]
    right: Callable[[], list[ModelLocalKVSpec]]
    wrong: dict[str, dict[str, Any]] = field(default_factory=dict)
    scope: ModelLocalKVScope = ModelLocalKVScope.INVOCATION


def run(owner: torch.nn.Module, max_num_seqs: int) -> Report:
    """Driven at one sequence and at ``max_num_seqs``: the declared bound is reached."""
    return check(owner, drive, max_num_seqs=max_num_seqs, batches=(1, max_num_seqs) if max_num_seqs > 1 else (1,))


def with_wrong(pattern: HandMade, changes: dict[str, Any]) -> list[ModelLocalKVSpec]:
    first, *rest = pattern.right()
    values = {f: getattr(first, f) for f in first.__dataclass_fields__}
    values.update(changes)
    return [ModelLocalKVSpec(**values), *rest]


def pasted(code: str, scope: ModelLocalKVScope) -> ModelLocalKVSpec:
    """The suggested code as an author pastes it: the scope comment written in, nothing else changed."""
    lines = []
    for line in code.splitlines():
        if line.strip().startswith("#"):
            assert line.strip().startswith("# scope:"), f"the suggestion left a field open: {line}"
            line = f"    scope=ModelLocalKVScope.{scope.name},"
        lines.append(line)
    names = {"torch": torch, "ModelLocalKVScope": ModelLocalKVScope, "RowDriver": RowDriver}
    spec: ModelLocalKVSpec = eval("\n".join(lines), {**names, "ModelLocalKVSpec": ModelLocalKVSpec})  # noqa: S307
    return spec


GEOMETRY: dict[str, dict[str, Any]] = {
    "kv_heads": {"kv_heads": HEADS - 1},
    "head_dim": {"head_dim": HEAD_DIM // 2},
    "dtype": {"dtype": torch.float16},
    "layers": {"layers": LAYERS + 1},
}
RING_WRONG: dict[str, dict[str, Any]] = {
    **GEOMETRY,
    "physical_capacity_positions": {"physical_capacity_positions": WINDOW - 2},
    "rows": {"rows": RowDriver.FIXED, "rows_fixed": 2, "rows_reason": "two slots"},
}
PATTERNS = (
    HandMade("static_ring", StaticRing, lambda: [declare()], RING_WRONG, ModelLocalKVScope.MODEL),
    HandMade("mixin_ring", MixinRing, lambda: [declare()], RING_WRONG, ModelLocalKVScope.MODEL),
    HandMade(
        "cross_attention",
        CrossAttention,
        lambda: [
            declare(name="self_attention", physical_capacity_positions=DECODED, scope=ModelLocalKVScope.REQUEST),
            declare(name="cross_attention", physical_capacity_positions=ENCODED, scope=ModelLocalKVScope.REQUEST),
        ],
        {**GEOMETRY, "physical_capacity_positions": {"physical_capacity_positions": DECODED - 1}},
        ModelLocalKVScope.REQUEST,
    ),
    HandMade(
        "int8_with_scales",
        Int8Cache,
        lambda: [
            declare(name="int8_kv", dtype=torch.int8, physical_capacity_positions=STEPS),
            declare(name="scales", dtype=torch.float32, physical_capacity_positions=1),
        ],
        {
            "kv_heads": {"kv_heads": HEADS - 1},
            "physical_capacity_positions": {"physical_capacity_positions": STEPS - 1},
        },
    ),
    HandMade(
        "doubling",
        Doubling,
        lambda: [declare(physical_capacity_positions=LONGEST)],
        {**GEOMETRY, "physical_capacity_positions": {"physical_capacity_positions": LONGEST // 2}},
    ),
)
BY_NAME = {pattern.name: pattern for pattern in PATTERNS}
WRONG = [(pattern, name) for pattern in PATTERNS for name in pattern.wrong]


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.name)
def test_the_exact_declaration_holds(pattern: HandMade) -> None:
    report = run(pattern.owner(pattern.right(), MADE_AT), MADE_AT)
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.HOLDS, report.text()
    report.assert_ok()


@pytest.mark.parametrize("pattern,field_name", WRONG, ids=[f"{p.name}-{f}" for p, f in WRONG])
def test_a_wrong_field_fails_naming_it(pattern: HandMade, field_name: str) -> None:
    report = run(pattern.owner(with_wrong(pattern, pattern.wrong[field_name]), MADE_AT), MADE_AT)
    owner = report.owner("")
    assert not owner.ok, report.text()
    assert field_name in [problem.field for problem in owner.problems], report.text()


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.name)
def test_the_suggestion_pasted_holds_at_1_8_and_64_sequences(pattern: HandMade) -> None:
    made = run(pattern.owner([], MADE_AT), MADE_AT).owner("")
    assert made.verdict.kind is VerdictKind.UNDECLARED and made.suggestions, made.text()
    specs = [pasted(suggestion.code, pattern.scope) for suggestion in made.suggestions]
    assert all(spec.rows is RowDriver.MAX_NUM_SEQS for spec in specs), made.text()
    for max_num_seqs in PASTED_AT:
        report = run(pattern.owner(specs, max_num_seqs), max_num_seqs)
        assert report.owner("").verdict.kind is VerdictKind.HOLDS, report.text()
        report.assert_ok()


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.name)
def test_a_cache_declared_twice_fails(pattern: HandMade) -> None:
    """Both specs of one cache in one owner: twice the bytes it holds, at its bound."""
    first, *rest = pattern.right()
    twice = [first, ModelLocalKVSpec(**{**vars(first), "name": "again"}), *rest]
    report = run(pattern.owner(twice, MADE_AT), MADE_AT)
    assert report.owner("").verdict.kind is VerdictKind.OVER_REPORTS, report.text()
    assert not report.ok


def test_the_ring_sized_for_max_num_seqs_is_max_num_seqs_not_a_fixed_count() -> None:
    """The evidence says why: the rows stayed at the run's max_num_seqs whatever the batch."""
    made = run(StaticRing([], MADE_AT), MADE_AT).owner("")
    (suggestion,) = made.suggestions
    assert "rows=RowDriver.MAX_NUM_SEQS," in suggestion.code and "rows_fixed" not in suggestion.code
    assert f"sized for max_num_seqs: {MADE_AT} rows whatever the batch" in made.text()


def test_writers_declaring_their_parents_cache_fail_naming_the_parent() -> None:
    """The parent holds the doubling cache; its two writers declaring it too would count it three times."""
    doubled = Doubling([declare(physical_capacity_positions=LONGEST)], MADE_AT, [declare(layers=1)])
    report = run(doubled, MADE_AT)
    assert report.owner("").verdict.kind is VerdictKind.HOLDS, report.text()
    for writer in ("first", "second"):
        verdict = report.owner(writer).verdict
        assert verdict.kind is VerdictKind.HELD_ELSEWHERE and not verdict.ok, report.text()
        assert "'(root)' (Doubling)" in verdict.text
    with pytest.raises(AssertionError, match=r"'first' \(DeclaringWriter\): declares a cache another module holds"):
        report.assert_ok()


def test_writers_declaring_a_cache_nobody_declares_fail_beside_the_parent_found_holding_it() -> None:
    """Only the writers declare: the parent is found holding the cache (undeclared) and each writer names it."""
    doubled = Doubling([], MADE_AT, [declare(layers=1, physical_capacity_positions=LONGEST)])
    report = run(doubled, MADE_AT)
    assert report.owner("").verdict.kind is VerdictKind.UNDECLARED, report.text()
    assert report.owner("first").verdict.kind is VerdictKind.HELD_ELSEWHERE, report.text()


def test_the_plain_tensor_ring_counts_for_its_owner() -> None:
    """Declared exactly, it holds (it was "declared cache never used" while the census reported the same bytes);
    undeclared, it is "declares nothing but held"; declared short of a window position, it under-reports."""
    right = run(PlainRing([declare()], MADE_AT), MADE_AT)
    owner = right.owner("")
    assert owner.verdict.kind is VerdictKind.HOLDS and owner.plain_bytes == owner.declared_bytes, right.text()
    assert [o.owner for o in right.owners] == [""], "the census find is the owner's, not a second report"
    right.assert_ok()
    bare = run(PlainRing([], MADE_AT), MADE_AT).owner("")
    assert bare.verdict.kind is VerdictKind.UNDECLARED and bare.observed_bytes == owner.declared_bytes
    short = run(PlainRing([declare(physical_capacity_positions=WINDOW - 1)], MADE_AT), MADE_AT).owner("")
    assert short.verdict.kind is VerdictKind.UNDER_REPORTS


def test_an_int8_declaration_that_leaves_the_scales_out_fails() -> None:
    """The bytes are judged: the scales the layer keeps are held, so the data alone under-reports."""
    data_only = [declare(name="int8_kv", dtype=torch.int8, physical_capacity_positions=STEPS)]
    report = run(Int8Cache(data_only, MADE_AT), MADE_AT)
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.UNDER_REPORTS, report.text()
    scales = 2 * LAYERS * MADE_AT * HEADS * HEAD_DIM * 4
    assert owner.observed_bytes == owner.declared_bytes + scales
    assert "dtype" in [problem.field for problem in owner.problems]


def test_the_layers_extra_tensors_are_weighed_whether_declared_or_not() -> None:
    """One rule: the doubling layer's backing buffers (keys and values are views of them) count once, declared or
    not, and the int8 layer's scales count beside its data."""
    declared = run(Doubling([declare(physical_capacity_positions=LONGEST)], MADE_AT), MADE_AT).owner("")
    undeclared = run(Doubling([], MADE_AT), MADE_AT).owner("")
    assert declared.observed_bytes == undeclared.observed_bytes == 2 * LAYERS * MADE_AT * HEADS * LONGEST * HEAD_DIM * 4


def test_the_max_num_seqs_rule_broken_on_purpose_turns_the_ring_fixed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without max_num_seqs, rows that stay at max_num_seqs are a fixed count: the exact declaration is blamed for
    rows, and the suggestion, FIXED 4, under-reports at 8 sequences (what main did)."""
    from modelkv_exporter.testing import infer
    from modelkv_exporter.testing import run as run_module

    real = infer.infer_rows
    monkeypatch.setattr(run_module, "infer_rows", lambda peaks, max_num_seqs=None: real(peaks))
    report = run(StaticRing([declare()], MADE_AT), MADE_AT)
    assert "rows" in [problem.field for problem in report.owner("").problems], report.text()
    (suggestion,) = run(StaticRing([], MADE_AT), MADE_AT).owner("").suggestions
    assert "rows=RowDriver.FIXED," in suggestion.code and f"rows_fixed={MADE_AT}," in suggestion.code


def test_the_layer_parts_broken_on_purpose_blame_the_right_int8_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a layer's bytes read as its keys' geometry alone, the scales inflate the int8 data's positions and the
    scales spec declares a dtype no layer seems to hold: the right declaration fails."""
    from modelkv_exporter.testing import peak_layout

    monkeypatch.setattr(
        peak_layout, "layer_parts", lambda layer, size: [(peak_layout.layer_geometry(layer, size), size)]
    )
    report = run(Int8Cache(BY_NAME["int8_with_scales"].right(), MADE_AT), MADE_AT)
    assert report.owner("").verdict.kind is VerdictKind.HOLDS, "the bytes still hold"
    assert "dtype" in [problem.field for problem in report.owner("").problems], report.text()
