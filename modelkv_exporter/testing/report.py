"""The check's result: per owner, what it declares at ``max_num_seqs``, what its caches held, the verdict,
the fields that disagree and the declaration that would hold; ``Report.assert_ok()`` for a test."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelkv_exporter.contract.snapshot import Declaration, DroppedDeclaration
from modelkv_exporter.judging.declaration_text import IMPORTS, Figure, evidence_lines, spec_code
from modelkv_exporter.judging.verdicts import Verdict, byte_text
from modelkv_exporter.testing.diagnosis import FieldProblem
from modelkv_exporter.testing.peak_layout import CallPeak


@dataclass(frozen=True)
class Suggestion:
    """A declaration that would hold what one geometry of the owner's caches held at its peak."""

    figures: tuple[Figure, ...]

    @property
    def missing(self) -> tuple[str, ...]:
        """The fields the run could not infer."""
        return tuple(f.field for f in self.figures if not f.inferred)

    @property
    def code(self) -> str:
        """``ModelLocalKVSpec(...)`` to paste, a comment where a figure was not inferred."""
        return spec_code(self.figures)

    def spec(self, **given: Any) -> Any:
        """The suggestion as a ``ModelLocalKVSpec``; ``given`` fills (or overrides) figures by field name.

        Raises ``ValueError`` naming every figure that was neither inferred nor given.
        """
        import torch

        from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver

        names = {"torch": torch, "ModelLocalKVScope": ModelLocalKVScope, "RowDriver": RowDriver}
        values = {f.field: eval(f.code, names) for f in self.figures if f.code is not None}  # noqa: S307 - our own literals
        values.update(given)
        missing = [f.field for f in self.figures if f.field not in values]
        if missing:
            raise ValueError(f"not inferred, give them: {', '.join(missing)}")
        return ModelLocalKVSpec(**values)


@dataclass(frozen=True)
class OwnerReport:
    """One owner: a declaring module, or one named or discovered that declares nothing."""

    owner: str
    owner_class: str
    verdict: Verdict
    declarations: tuple[Declaration, ...] = ()
    problems: tuple[FieldProblem, ...] = ()
    calls: int | None = None
    cache_calls: int | None = None
    live_bytes: int | None = None
    peaks: tuple[CallPeak, ...] = ()
    suggestions: tuple[Suggestion, ...] = ()
    found_by: str = ""
    """Empty for a declarer; ``named`` (given to the check) or the discovery method otherwise."""
    plain_bytes: int = 0
    """Bytes of plain tensors (in no cache layer) it held at the end of the run, by the census: counted in
    ``observed_bytes`` (a cache counts whatever keeps it)."""
    plain_layout: str = ""
    """How the plain tensors' key/value layout was read (a suggestion comes from it), or why none could be: bytes
    only (``testing.plain_layout``)."""

    @property
    def ok(self) -> bool:
        """The verdict passes and no field disagrees."""
        return self.verdict.ok and not self.problems

    @property
    def declared_bytes(self) -> int:
        """Its declared peak at ``max_num_seqs``."""
        return self.verdict.declared_bytes

    @property
    def observed_bytes(self) -> int | None:
        """The most its caches held at once (None: not observed)."""
        return self.verdict.observed_bytes

    @property
    def headline(self) -> str:
        """What is wrong first (the wrong fields, or the verdict when it fails), then the verdict."""
        fields = ", ".join(dict.fromkeys(problem.field for problem in self.problems))
        if not fields:
            return self.verdict.text
        if self.verdict.ok:
            return f"wrong field {fields}; {self.verdict.text}"
        return f"{self.verdict.text}; wrong field {fields}"

    def __repr__(self) -> str:
        return f"OwnerReport({self.label}: {self.headline})"

    @property
    def label(self) -> str:
        """``'path' (Class)``."""
        found = f", found by {self.found_by}" if self.found_by else ""
        return f"{self.owner or '(root)'!r} ({self.owner_class}{found})"

    def text(self) -> str:
        """The owner's part of the report: verdict, wrong fields, calls, the suggestion with its evidence."""
        lines = [f"{'ok  ' if self.ok else 'FAIL'} {self.label}: {self.headline}"]
        for declaration in self.declarations:
            lines.append(
                f"       declares {declaration.name}: {declaration.layers} layers x {declaration.kv_heads} kv_heads x "
                f"{declaration.head_dim} head_dim x {declaration.physical_capacity_positions} positions, "
                f"{declaration.dtype}, rows {declaration.rows}"
                + (f" {declaration.rows_fixed}" if declaration.rows == "fixed" else "")
                + f" -> {declaration.row_count} rows, {byte_text(declaration.peak_bytes)}"
            )
        if self.plain_bytes:
            lines.append(
                f"       plain tensors it holds (no cache layer; census at the end of the run): "
                f"{byte_text(self.plain_bytes)}, counted in what it held; {self.plain_layout}"
            )
        lines += [f"       wrong field {problem.text}" for problem in self.problems]
        if self.peaks:
            shown = ", ".join(
                (f"#{p.call}" if p.call else "outside its own calls")
                + (f" (batch {p.batch})" if p.batch is not None else "")
                + f" {byte_text(p.bytes)}"
                for p in self.peaks[:8]
            )
            more = f" and {len(self.peaks) - 8} more" if len(self.peaks) > 8 else ""
            lines.append(f"       calls that held caches, peak of each: {shown}{more}")
        if self.suggestions and not self.ok:
            lines.append("       suggested declaration (what would hold what the run saw):")
            for suggestion in self.suggestions:
                lines += ["         " + line for line in suggestion.code.splitlines()]
                lines.append("       evidence:")
                lines += evidence_lines(suggestion.figures, "         ")
        return "\n".join(lines)


@dataclass(frozen=True)
class Report:
    """Every owner the check observed, at one ``max_num_seqs``."""

    max_num_seqs: int
    owners: tuple[OwnerReport, ...]
    dropped: tuple[DroppedDeclaration, ...] = ()
    """Declarers whose ``model_local_kv_specs()`` raised, or specs that could not be resolved."""
    unavailable: str | None = None
    """Why nothing could be observed (this ``transformers``, a failure inside observation), if so."""
    census_below_floor: int = 0
    """Modules the census found holding new tensors below ``census_floor_bytes``, left out."""
    census_floor_bytes: int = 0
    near_misses: tuple[tuple[str, str, str], ...] = ()
    """``(path, class, name)`` of modules defining a method named almost ``model_local_kv_specs``, and not it."""

    @property
    def ok(self) -> bool:
        """Every owner passes, no declaration was dropped, no method name is a near miss, and observation worked."""
        return (
            self.unavailable is None
            and not self.dropped
            and not self.near_misses
            and all(owner.ok for owner in self.owners)
        )

    @property
    def run_failures(self) -> list[str]:
        """One line per thing that fails beside the owners: observation, a dropped declaration, a misspelled
        declaring method."""
        found = [f"observation unavailable: {self.unavailable}"] if self.unavailable else []
        found += [
            f"{d.owner or '(root)'!r} ({d.owner_class}): {d.count} declaration(s) dropped, {d.reason}: {d.error}"
            for d in self.dropped
        ]
        return found + [
            f"{path or '(root)'!r} ({owner_class}): defines {name}(), not model_local_kv_specs(): the engine never "
            "calls it, so nothing is declared"
            for path, owner_class, name in self.near_misses
        ]

    def owner(self, path: str) -> OwnerReport:
        """The report of the owner at ``path`` (``""`` = the root)."""
        for owner in self.owners:
            if owner.owner == path:
                return owner
        raise KeyError(f"no owner {path!r}; observed: {[o.owner for o in self.owners]}")

    def by_owner(self) -> Mapping[str, OwnerReport]:
        """Every owner's report by its path."""
        return {owner.owner: owner for owner in self.owners}

    def text(self) -> str:
        """The whole report for people."""
        lines = [f"model-local KV check at max_num_seqs={self.max_num_seqs}:"]
        lines += [f"FAIL {line}" for line in self.run_failures]
        if not self.owners:
            lines.append("no owner declares a cache, and none was named")
        lines += [owner.text() for owner in self.owners]
        if self.census_below_floor:
            lines.append(
                f"     {self.census_below_floor} more modules held new tensors below {byte_text(self.census_floor_bytes)} "
                "(census_floor_bytes): not reported"
            )
        if any(owner.suggestions and not owner.ok for owner in self.owners):
            lines.append(f"the suggestions need:\n{IMPORTS}")
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"Report(max_num_seqs={self.max_num_seqs}, {len(self.owners)} owners, {'ok' if self.ok else 'failing'})"

    @property
    def failures(self) -> list[str]:
        """One line per thing that fails: ``run_failures``, then each failing owner (its headline)."""
        return self.run_failures + [f"{owner.label}: {owner.headline}" for owner in self.owners if not owner.ok]

    def assert_ok(self) -> Report:
        """Raise ``AssertionError`` when anything fails: what fails first, one line each, then the whole report;
        return the report when all pass."""
        __tracebackhide__ = True
        if not self.ok:
            raise AssertionError(
                f"model-local KV check at max_num_seqs={self.max_num_seqs} failed:\n"
                + "".join(f"  {line}\n" for line in self.failures)
                + "\n"
                + self.text()
            )
        return self
