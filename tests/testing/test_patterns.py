"""The check on every way of keeping caches in docs/declaring-caches.md's table: a right declaration holds, a
wrong one per field fails naming that field, and the suggestion, pasted, holds at two ``max_num_seqs`` it was
not made at. The issue's per-request talker first, then every pattern; and the row inference broken on purpose."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver
from modelkv_exporter.testing import Report, VerdictKind, check
from modelkv_exporter.testing.caches import CacheTracker
from tests.testing.patterns import BY_NAME, PATTERNS, POSITIONS, PREFILL, Pattern, Talker, declare, step_requests

TALKER = BY_NAME["per_request_dict"]
BATCHES = (1, 2)


def run(pattern: Pattern, model: torch.nn.Module, max_num_seqs: int = 2, batches: tuple[int, ...] = BATCHES) -> Report:
    return check(model, pattern.drive, max_num_seqs=max_num_seqs, batches=batches)


def fields_named(report: Report) -> list[str]:
    (owner,) = report.owners
    return [problem.field for problem in owner.problems]


def pasted(code: str, pattern: Pattern) -> ModelLocalKVSpec:
    """The suggested code as an author pastes it: the comments it leaves written in, nothing else changed."""
    written = {
        "scope": f"scope=ModelLocalKVScope.{pattern.scope.name},",
        "rows_reason": 'rows_reason="the captured batch sizes",',
    }
    lines = []
    for line in code.splitlines():
        comment = line.strip()
        if comment.startswith("#"):
            field = comment[1:].split(":", 1)[0].strip()
            assert field in written, f"the suggestion left {field} open: {line}"
            line = "    " + written[field]
        lines.append(line)
    names = {"torch": torch, "ModelLocalKVScope": ModelLocalKVScope, "RowDriver": RowDriver}
    spec: ModelLocalKVSpec = eval("\n".join(lines), {**names, "ModelLocalKVSpec": ModelLocalKVSpec})  # noqa: S307
    return spec


def test_the_issues_talker_holds_its_right_declaration() -> None:
    """One DynamicCache per request in a dict: 3 layers, 2 kv heads, head dim 16, 40 positions, a row per request."""
    report = run(TALKER, Talker([declare()]))
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.HOLDS and owner.ok, report.text()
    assert owner.declared_bytes == owner.observed_bytes == 2 * 2 * 3 * 2 * 16 * POSITIONS * 4
    assert [(p.batch, p.rows, p.caches) for p in owner.peaks if p.bytes == max(q.bytes for q in owner.peaks)] == [
        (2, 2, 2)
    ]
    report.assert_ok()


@pytest.mark.parametrize("kv_heads,kind", [(1, VerdictKind.UNDER_REPORTS), (4, VerdictKind.OVER_REPORTS)])
def test_the_issues_talker_with_wrong_kv_heads_fails_naming_kv_heads(kv_heads: int, kind: VerdictKind) -> None:
    """Two requests ran at once to their longest: the bound was reached, so it is never called "not reached"."""
    report = run(TALKER, Talker([declare(kv_heads=kv_heads)]))
    owner = report.owner("")
    assert owner.verdict.kind is kind and fields_named(report) == ["kv_heads"]
    assert "bound not reached" not in report.text()
    with pytest.raises(AssertionError, match=r"'\(root\)' \(Talker\): .*; wrong field kv_heads"):
        report.assert_ok()


def test_the_issues_talker_without_a_declaration_fails_as_undeclared_and_its_suggestion_holds_elsewhere() -> None:
    report = run(TALKER, Talker([]))
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.UNDECLARED and not report.ok
    (suggestion,) = owner.suggestions
    assert "layers=3," in suggestion.code and "rows=RowDriver.MAX_NUM_SEQS," in suggestion.code
    assert "physical_capacity_positions=40," in suggestion.code and "..." not in suggestion.code
    spec = pasted(suggestion.code, TALKER)
    for max_num_seqs in (3, 5):
        again = run(TALKER, Talker([spec]), max_num_seqs, (1, max_num_seqs))
        assert again.owner("").verdict.kind is VerdictKind.HOLDS, again.text()


def test_bound_not_reached_says_which_bound_and_what_was_reached() -> None:
    rows = run(TALKER, Talker([declare()]), max_num_seqs=4).owner("")
    assert rows.verdict.kind is VerdictKind.NOT_REACHED and rows.ok
    assert "the run held at most 2 rows of the 4 declared at max_num_seqs" in rows.verdict.text
    positions = run(TALKER, Talker([declare(physical_capacity_positions=48)])).owner("")
    assert positions.verdict.kind is VerdictKind.NOT_REACHED
    assert positions.verdict.detail == "at most 40 positions in a layer of the 48 declared"


def test_the_row_inference_broken_on_purpose_turns_the_right_declaration_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without knowing which cache a layer belongs to, separate per-request caches look like more layers: the
    issue's failure (rows blamed, ``layers=6`` suggested), which pasted would under-report at 4 sequences."""
    monkeypatch.setattr(CacheTracker, "layer_caches", lambda self: {})
    report = run(TALKER, Talker([declare()]))
    owner = report.owner("")
    assert not report.ok and fields_named(report) == ["layers", "rows"], report.text()
    assert "declare RowDriver.FIXED" in report.text()
    (suggestion,) = owner.suggestions
    assert "layers=6," in suggestion.code


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.name)
def test_a_right_declaration_holds(pattern: Pattern) -> None:
    report = run(pattern, pattern.model())
    (owner,) = report.owners
    assert owner.verdict.kind is VerdictKind.HOLDS and owner.ok, report.text()


@pytest.mark.parametrize(
    "pattern,field",
    [(pattern, field) for pattern in PATTERNS for field in pattern.wrong],
    ids=lambda value: value if isinstance(value, str) else value.name,
)
def test_a_wrong_field_fails_naming_it(pattern: Pattern, field: str) -> None:
    report = run(pattern, pattern.with_wrong(field))
    assert not report.ok and fields_named(report) == [field], report.text()
    with pytest.raises(AssertionError, match=f"wrong field {field}"):
        report.assert_ok()


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.name)
def test_the_suggestion_pasted_holds_at_two_max_num_seqs_it_was_not_made_at(pattern: Pattern) -> None:
    report = run(pattern, pattern.model([]))
    (owner,) = report.owners
    assert owner.verdict.kind is VerdictKind.UNDECLARED
    specs = [pasted(suggestion.code, pattern) for suggestion in owner.suggestions]
    assert specs, report.text()
    for max_num_seqs in (3, 5):
        batches = (1, min(max_num_seqs, pattern.largest_batch))
        again = run(pattern, pattern.model(specs), max_num_seqs, batches)
        (checked,) = again.owners
        assert checked.verdict.kind is VerdictKind.HOLDS and again.ok, again.text()


def test_the_patterns_are_what_their_names_say() -> None:
    """The talker keeps a cache per live request on itself between calls, none after the last."""
    talker = Talker([declare()])

    def first_steps(model: Any, size: int) -> None:
        model(list(range(size)))

    check(talker, first_steps, max_num_seqs=2, batches=(2,))
    assert len(talker.caches) == 2
    for _ in range(POSITIONS - PREFILL):
        talker(list(range(2)))
    assert talker.caches == {}
    step_requests(talker, 3)
    assert talker.caches == {}
