"""The check on small real owners: every verdict, the honest limits of each inference, and the parts that
could silently go wrong (positions from storage, the recorder's view of the peak, the observer left behind)."""

from __future__ import annotations

import pytest
import torch

from modelkv_exporter.contract.snapshot import DiscoveredOwner, KVLayout
from modelkv_exporter.engine.observe import installed
from modelkv_exporter.judging.verdicts import judge
from modelkv_exporter.testing import VerdictKind, check, observe, peak_layout
from tests.testing.owners import HEAD_DIM, HEADS, LAYERS, LENGTH, ROW, Generator, Idle, Windowed, drive, spec


def test_a_right_declaration_at_its_bound_holds() -> None:
    report = check(Generator(), drive, max_num_seqs=2, batches=(1, 2))
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.HOLDS and owner.observed_bytes == owner.declared_bytes == 2 * ROW
    assert [(p.batch, p.rows, p.bytes) for p in owner.peaks] == [(1, 1, ROW), (2, 2, 2 * ROW)]
    assert report.assert_ok() is report and "ok   '(root)' (Generator): holds what it declares" in report.text()


def test_the_recorded_layers_at_each_peak_add_up_to_the_observed_peak() -> None:
    """The groups are read when the observer's count rises: they weigh exactly what it counted."""
    owner = check(Generator(), drive, max_num_seqs=2, batches=(1, 2)).owner("")
    for peak in owner.peaks:
        assert sum(group.bytes for group in peak.groups) + peak.other_bytes == peak.bytes
    assert max(p.bytes for p in owner.peaks) == owner.observed_bytes


def test_below_the_bound_holding_less_is_not_over_reporting() -> None:
    report = check(Generator(), drive, max_num_seqs=4, batches=(1, 2))
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.NOT_REACHED and owner.ok
    assert "at most 2 rows of the 4 declared at max_num_seqs" in owner.verdict.text


def test_at_the_bound_holding_less_is_over_reporting() -> None:
    report = check(Generator([spec(physical_capacity_positions=2 * LENGTH)]), drive, max_num_seqs=2, batches=(1, 2))
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.NOT_REACHED, "16 positions declared, 8 reached: not the bound"
    report = check(Generator([spec(layers=2 * LAYERS)]), drive, max_num_seqs=2, batches=(1, 2))
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.OVER_REPORTS and owner.verdict.factor == 2
    with pytest.raises(AssertionError, match="over-reports by 2.00x"):
        report.assert_ok()


def test_a_declared_cache_never_used() -> None:
    report = check(Idle(), drive, max_num_seqs=1, batches=(1,))
    assert report.owner("").verdict.kind is VerdictKind.UNUSED
    with pytest.raises(AssertionError, match="declared cache never used"):
        report.assert_ok()


def test_an_owner_never_called_is_not_checked_and_fails() -> None:
    report = check(Generator(), lambda model: None, max_num_seqs=1)
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.UNKNOWN and "no call of this owner" in owner.verdict.text
    assert not report.ok


def test_a_named_module_that_declares_nothing_is_observed_too() -> None:
    model = torch.nn.Module()
    model.window = Windowed(window=6)
    report = check(model, lambda m, size: m.window(size), max_num_seqs=1, batches=(1,), owners=["window"])
    owner = report.owner("window")
    assert owner.found_by == "named" and owner.verdict.kind is VerdictKind.UNDECLARED
    assert "declares nothing but held" in owner.verdict.text


def test_positions_count_the_storage_a_window_view_keeps_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window of 6 fed 5 positions at a time keeps 5 visible and 10 allocated; the suggestion must say 10."""
    model = Windowed(window=6)

    def drive_twice(m: Windowed, size: int) -> None:
        m(size)
        m(size)

    (suggestion,) = check(model, drive_twice, max_num_seqs=1, batches=(1,), owners=[""]).owner("").suggestions
    assert "physical_capacity_positions=10," in suggestion.code

    def from_shape(layer: object, size: int) -> object:
        keys = layer.__dict__["keys"]
        rows, heads, positions, head_dim = keys.shape
        return rows, heads, head_dim, "float32", 4, positions

    monkeypatch.setattr(peak_layout, "layer_geometry", from_shape)
    (broken,) = check(model, drive_twice, max_num_seqs=1, batches=(1,), owners=[""]).owner("").suggestions
    assert "physical_capacity_positions=5," in broken.code, "counted from the view, it would under-report 2x"


def test_rows_and_capacity_are_not_guessed_from_too_little() -> None:
    """One call, no batch sizes: the suggestion leaves rows and capacity open and says why."""
    report = check(Generator([]), lambda model: model(3), max_num_seqs=3)
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.UNDECLARED
    (suggestion,) = owner.suggestions
    assert set(suggestion.missing) == {"physical_capacity_positions", "capacity_source", "scope", "rows"}
    assert "# rows: not inferred: the calls held 3 rows and no batch sizes were given" in suggestion.code
    assert "..." not in suggestion.code and "rows=" not in suggestion.code
    assert "at least 8 a row" in suggestion.code and "reached in one call only" in suggestion.code
    assert f"layers={LAYERS}," in suggestion.code and f"kv_heads={HEADS}," in suggestion.code
    assert f"head_dim={HEAD_DIM}," in suggestion.code and "dtype=torch.float32," in suggestion.code
    with pytest.raises(ValueError, match="not inferred, give them: physical_capacity_positions, capacity_source"):
        suggestion.spec(scope="invocation")


def test_a_fixed_count_is_inferred_when_rows_stay_over_batch_sizes() -> None:
    report = check(Generator([]), lambda model, size: model(1), max_num_seqs=4, batches=(1, 4))
    (suggestion,) = report.owner("").suggestions
    assert "rows=RowDriver.FIXED," in suggestion.code and "rows_fixed=1," in suggestion.code
    assert "# rows_reason: not inferred" in suggestion.code and "rows_reason=" not in suggestion.code


def test_a_discovered_owner_from_a_source_is_reported_with_its_layout() -> None:
    layout = KVLayout(layers=28, kv_heads=8, head_dim=128, dtype="bfloat16", element_size=2, positions=4096, rows=4)
    peak = 2 * 28 * 8 * 128 * 2 * 4 * 4096
    found = DiscoveredOwner("thinker.audio", "AudioEncoder", "census", peak, peak, 0, layout=layout)
    report = check(Generator(), drive, max_num_seqs=2, batches=(1, 2), discovery=lambda: [found])
    owner = report.owner("thinker.audio")
    assert owner.found_by == "census" and owner.verdict.kind is VerdictKind.UNDECLARED and not report.ok
    (suggestion,) = owner.suggestions
    assert "layers=28," in suggestion.code and "dtype=torch.bfloat16," in suggestion.code
    assert f"at least 4096 a row: the peak ({peak:,} B) at 4 rows" in suggestion.code


def test_the_check_leaves_no_observer_behind_and_refuses_to_nest() -> None:
    model = Generator()
    with observe(model, max_num_seqs=1) as run:
        with pytest.raises(RuntimeError, match="already installed"):
            observe(model, max_num_seqs=1).__enter__()
        model(1)
    assert installed() is None and run.report is not None
    assert run.report.owner("").verdict.kind is VerdictKind.HOLDS
    assert "forward" not in model.__dict__, "the owner's method wrappers are removed"


def test_a_failing_drive_leaves_no_observer_behind() -> None:
    with pytest.raises(ZeroDivisionError), observe(Generator(), max_num_seqs=1):
        1 / 0  # noqa: B018
    assert installed() is None


@pytest.mark.parametrize(
    "declared,observed,calls,cache_calls,reached,kind",
    [
        (100, 100, 1, 1, False, VerdictKind.HOLDS),
        (100, 150, 1, 1, None, VerdictKind.UNDER_REPORTS),
        (100, 50, 1, 1, True, VerdictKind.OVER_REPORTS),
        (100, 50, 1, 1, False, VerdictKind.NOT_REACHED),
        (100, 50, 1, 1, None, VerdictKind.NOT_REACHED),
        (0, 10, 1, 1, None, VerdictKind.UNDECLARED),
        (0, 0, 1, 0, None, VerdictKind.NOTHING),
        (100, 0, 3, 0, True, VerdictKind.UNUSED),
        (100, None, 0, None, None, VerdictKind.UNKNOWN),
    ],
)
def test_judge(
    declared: int, observed: int | None, calls: int, cache_calls: int | None, reached: bool | None, kind: VerdictKind
) -> None:
    verdict = judge(
        declared_bytes=declared, observed_bytes=observed, calls=calls, cache_calls=cache_calls, reached=reached
    )
    assert verdict.kind is kind


def test_a_module_that_declares_nothing_is_discovered_without_being_named() -> None:
    """The engine's discovery, run by the check: a cache built while no declaring owner runs has an owner."""
    model = torch.nn.Module()
    model.generator = Generator()
    model.window = Windowed(window=6)

    def both(m: torch.nn.Module, size: int) -> None:
        m.generator(size)
        m.window(size)

    report = check(model, both, max_num_seqs=2, batches=(1, 2))
    assert report.owner("generator").verdict.kind is VerdictKind.HOLDS
    found = report.owner("window")
    assert found.found_by == "cache_layer" and found.verdict.kind is VerdictKind.UNDECLARED
    assert found.observed_bytes == 2 * 2 * LAYERS * HEADS * HEAD_DIM * 10 * 4, "two rows of a 10-position storage"
    (suggestion,) = found.suggestions
    assert f"layers={LAYERS}," in suggestion.code and f"kv_heads={HEADS}," in suggestion.code
    assert "physical_capacity_positions=10," in suggestion.code and "rows=RowDriver.MAX_NUM_SEQS," in suggestion.code
    assert "reached at 2 batch labels (1, 2)" in report.text()
    with pytest.raises(AssertionError, match=r"'window' \(Windowed, found by cache_layer\): declares nothing but held"):
        report.assert_ok()
    off = check(model, both, max_num_seqs=2, batches=(1, 2), discover=False)
    assert [o.owner for o in off.owners] == ["generator"] and off.ok


@pytest.mark.parametrize(
    "field,value", [("scope", ...), ("scope", "forever"), ("layers", "6"), ("kv_heads", 2.5), ("head_dim", -4)]
)
def test_a_declaration_an_engine_would_drop_fails_the_check_naming_its_field(field: str, value: object) -> None:
    """Before: it passed the check and publish(), and the sidecar rejected the engine's whole snapshot."""
    report = check(Generator([spec(**{field: value})]), drive, max_num_seqs=2, batches=(1, 2))
    assert not report.ok and report.dropped[0].count == 1
    (headline,) = report.failures[:1]
    assert f"invalid field {field}:" in headline
    with pytest.raises(AssertionError, match=f"declaration\\(s\\) dropped, unresolvable_spec: .*invalid field {field}"):
        report.assert_ok()
