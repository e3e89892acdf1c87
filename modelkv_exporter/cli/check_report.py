"""``check``: per owner of every engine in a spool, the verdict on its declaration and a declaration to hand
its model author.

Made from snapshot figures alone (no torch): the verdict is ``judging.verdicts.judge``, the same
one ``modelkv_exporter.testing`` gives in a model's tests. A running engine never says whether it
ran at its bound, so holding less than declared is "bound not reached", never "over-reports".
Suggestions come from what the engine reports: a discovered owner's key/value layout, or a
declaring owner's own geometry resized to what its caches held. Every line is printed with its
unprintable characters escaped (snapshot text is untrusted).
"""

from __future__ import annotations

from dataclasses import dataclass

from modelkv_exporter.cli.reports import rejected_lines
from modelkv_exporter.cli.text_layout import MAX_WIDTH, wrapped
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.judging.declaration_text import IMPORTS, Figure, evidence_lines, layout_figures, resized_figures
from modelkv_exporter.judging.declaration_text import spec_code as code_of
from modelkv_exporter.judging.verdicts import Verdict, VerdictKind, holder_text, judge
from modelkv_exporter.sidecar.label_values import ROOT_OWNER
from modelkv_exporter.sidecar.presentation.safe_text import printable
from modelkv_exporter.sidecar.presentation.spool_report import rejected_files
from modelkv_exporter.sidecar.reader.scan import SpoolScan

TESTING_HINT = (
    "run modelkv_exporter.testing on the model (docs/declaring-caches.md) for a suggestion with its geometry checked"
)

UNOBSERVED = (
    "nothing judged: this snapshot carries declarations and no observations (a one-shot publish() without "
    "observer=, or an engine that does not observe): a verdict needs what the caches held, which a running "
    "engine observes (the vLLM plugin, SnapshotPublisher with observer.sample) or publish(model, ..., "
    "observer=observer) writes after the model ran; or " + TESTING_HINT
)
"""What ``check`` says of an engine whose snapshot has declarations and no observation at all."""


@dataclass(frozen=True)
class OwnerVerdict:
    """One owner of one engine: its verdict, and the figures of a declaration that would hold (if any)."""

    owner: str
    owner_class: str
    verdict: Verdict
    figures: tuple[Figure, ...] | None
    found_by: str = ""


def owner_verdicts(snapshot: Snapshot) -> list[OwnerVerdict]:
    """Every declaring owner's verdict, then every discovered owner's."""
    found: list[OwnerVerdict] = []
    for owner, observation in snapshot.owners().items():
        declarations = [d for d in snapshot.declarations if d.owner == owner]
        owner_class = declarations[0].owner_class if declarations else (observation.owner_class if observation else "")
        available = observation is not None and observation.available
        verdict = judge(
            declared_bytes=snapshot.declared_peak_of(owner),
            observed_bytes=observation.peak_bytes if available and observation is not None else None,
            calls=observation.calls if observation is not None else None,
            cache_calls=observation.cache_calls if observation is not None else None,
            reached=None,
            unobserved=(observation.reason or "") if observation is not None else "the engine does not report it",
            held_by=""
            if observation is None or observation.held_by is None
            else holder_text(observation.held_by, observation.held_by_class),
        )
        figures = None
        if verdict.kind is VerdictKind.UNDER_REPORTS and verdict.observed_bytes is not None:
            figures = resized_figures(owner, verdict.observed_bytes, declarations)
        found.append(OwnerVerdict(owner, owner_class, verdict, figures))
    for discovered in snapshot.discovered:
        detail = f"found by {discovered.found_by}" + (", beyond the caches it declares" if discovered.declares else "")
        verdict = Verdict(VerdictKind.UNDECLARED, 0, discovered.peak_bytes, detail)
        figures = (
            None
            if discovered.layout is None
            else layout_figures(discovered.owner, discovered.peak_bytes, discovered.layout)
        )
        found.append(OwnerVerdict(discovered.owner, discovered.owner_class, verdict, figures, discovered.found_by))
    return found


def _suggestion(item: OwnerVerdict, width: int) -> list[str]:
    if item.verdict.ok or item.verdict.kind is VerdictKind.UNKNOWN:
        return []
    if item.figures is None:
        return [
            wrapped(
                f"no suggestion from the spool: the engine reports no geometry for it; {TESTING_HINT}", width, "    "
            )
        ]
    lines = ["    suggested declaration:"]
    lines += ["      " + line for line in code_of(item.figures).splitlines()]
    lines.append("    evidence:")
    lines += [wrapped(line, width, "      ") for line in evidence_lines(item.figures)]
    return lines


def check_report(scan: SpoolScan, width: int = MAX_WIDTH) -> tuple[str, bool]:
    """The verdicts of every engine in the spool (ended ones too), and whether every one passes.

    Rejected files are listed with their reason and fail the check; so does a spool in which nothing
    was judged (no snapshot, or no owner in any).
    """
    if not scan.ok:
        return wrapped(f"cannot read the spool: {scan.error}", width, "") + "\n", False
    parts: list[str] = []
    passing = True
    judged = 0
    suggested = False
    for _, snapshot in scan.snapshots:
        engine = snapshot.engine
        heading = f"engine {engine.engine_id}" + (f", stage {engine.stage_label}" if engine.stage_label else "")
        max_num_seqs = snapshot.settings.max_num_seqs
        parts.append(
            heading
            + f", max_num_seqs {'none' if max_num_seqs is None else max_num_seqs}"
            + (", ended" if snapshot.ended else "")
        )
        items = owner_verdicts(snapshot)
        if not items:
            parts.append("  no owner declares a cache or was discovered")
        elif snapshot.declarations and not snapshot.observations:
            parts.append(wrapped(f"  FAIL {UNOBSERVED}", width, ""))
        judged += len(items) + len(snapshot.dropped_declarations or ())
        for item in items:
            passing = passing and item.verdict.ok
            mark = "ok  " if item.verdict.ok else "FAIL"
            name = f"{item.owner or ROOT_OWNER} ({item.owner_class or '?'})"
            parts.append(wrapped(f"  {mark} {name}: {item.verdict.text}", width, ""))
            lines = _suggestion(item, width)
            suggested = suggested or any("suggested declaration" in line for line in lines)
            parts += lines
        for dropped in snapshot.dropped_declarations or ():
            passing = False
            text = f"  FAIL {dropped.owner or ROOT_OWNER} ({dropped.owner_class}): {dropped.count} declaration(s) "
            parts.append(wrapped(text + f"dropped, {dropped.reason}: {dropped.error}", width, ""))
        parts.append("")
    rejected = rejected_lines(rejected_files(scan), scan.skipped, width, "FAIL ")
    if rejected:
        parts += [*rejected, ""]
        passing = False
    if not judged:
        passing = False
        if scan.snapshots:
            found = "no engine has an owner that declares a cache or was discovered"
        elif scan.entries or scan.skipped:
            found = "no snapshot in the spool could be read"
        else:
            found = "no snapshots in the spool"
        parts.append(f"FAIL judged nothing: {found}")
    if suggested:
        parts += ["the suggestions need:", IMPORTS, ""]
    text = "\n".join(printable(line) for line in "\n".join(parts).split("\n"))
    return text.rstrip() + "\n", passing
