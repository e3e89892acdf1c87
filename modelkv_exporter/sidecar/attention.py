"""What about an engine needs a person's attention, and what to do next: the one wording of every finding.

The landing page, ``inspect``'s summary, ``plan``'s warnings and the demo's summary all say a
finding in these words (``Problem.text``) and give its next step from here (``NEXT_STEPS``): the
change that fixes it, the command to run, the runbook section of the alert that fires for it, and,
where the snapshot shows enough, the declaration to add (``Problem.suggestion``, written by
``judging.declaration_text`` as ``check`` writes it).

The findings mirror the alerts an operator would get from the rules
(``deploy/prometheus/modelkv-rules.yaml``), with the figures one snapshot holds: an owner observed
above its declaration (``ModelKVDeclarationUnderReports``, same tolerance), a module holding cache
memory it does not declare (``ModelKVUndeclaredCache``), declarations the engine dropped
(``ModelKVDeclarationsDropped``), an owner called many times whose declared cache was never used
(``ModelKVDeclaredCacheUnused``, over the engine's lifetime rather than 30 minutes), growth since the
baseline that neither the memory profile nor the caches explain (``ModelKVUndeclaredMemoryGrowth``,
judged by ``sidecar.growth`` as the rule judges it, without its 15 minutes), and a stale heartbeat
(``ModelKVSnapshotStale``, without its 5 minutes); before all of them, an engine that died
(``sidecar.post_mortem``: ended ``out_of_memory``, ``ModelKVEngineOutOfMemory``, or ``error``) or vanished (killed
without ending its snapshot, ``ModelKVSnapshotStale``), until it is forgotten; about the spool rather than an engine,
no engine publishing into it at all (``ModelKVNoEnginePublishing``, ``no_engine``). Texts are plain; a page
escapes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from modelkv_exporter.contract.sizes import human_bytes, signed_bytes
from modelkv_exporter.contract.snapshot import DiscoveredOwner, Snapshot
from modelkv_exporter.contract.thresholds import (
    NO_ENGINE_SECONDS,
    UNDECLARED_GROWTH_BYTES,
    UNDER_REPORT_TOLERANCE,
    UNUSED_MIN_CALLS,
)
from modelkv_exporter.judging.declaration_text import Figure, layout_figures, resized_figures, spec_code
from modelkv_exporter.sidecar.discovered import discovery_running
from modelkv_exporter.sidecar.growth import Growth, growth
from modelkv_exporter.sidecar.label_values import ROOT_OWNER
from modelkv_exporter.sidecar.post_mortem import post_mortem
from modelkv_exporter.sidecar.reader.state import STALE_STATES, EngineState, SpoolView

NAMED = 3
"""Owners named per finding; the rest are counted, so a finding stays short whatever the snapshot holds."""
CLI = "modelkv-exporter"
"""The command as the page writes it (the sidecar image has it on ``PATH``)."""
RUNBOOK_DOC = "docs/runbook.md"
"""Where the runbook is in a checkout, named when no runbook address is set."""
SIDECAR_CONTAINER = "modelkv-exporter"
"""The sidecar container's name in the manifests and the post-renderer's pods."""


class Concern(str, Enum):
    """Why an engine needs attention, in the order the page lists them."""

    DIED = "died"
    VANISHED = "vanished"
    STALE = "stale"
    UNDER_REPORTS = "under-reports"
    UNDECLARED = "undeclared cache"
    DROPPED = "dropped declarations"
    UNUSED = "declared cache unused"
    GROWTH = "unexplained growth"
    NO_ENGINE = "no engine"


class Status(str, Enum):
    """An engine's status on the landing page."""

    OK = "ok"
    ATTENTION = "attention"
    DIED = "died"
    STALE = "stale"
    ENDED = "ended"
    FORGOTTEN = "forgotten"


@dataclass(frozen=True)
class NextStep:
    """What to do about one concern: the change that fixes it, the command that shows it, the alert's runbook."""

    fix: str
    command: str
    """The ``modelkv-exporter`` subcommand to run on the spool."""
    shows: str
    """What that command prints."""
    alert: str
    """The alert that fires for it, whose runbook section says more."""

    def command_line(self, spool: str = "", cli: str = CLI) -> str:
        """The command to run, as a person types it; without ``spool`` it reads ``MODELKV_SPOOL_DIR`` (which the
        sidecar's container sets)."""
        return f"{cli} {self.command} {spool}".rstrip()

    def in_pod(self) -> str:
        """The command as typed on a laptop with ``kubectl``: run in the sidecar's container of the engine's pod,
        whose ``PATH`` has the command and whose ``MODELKV_SPOOL_DIR`` names the spool."""
        return f"kubectl exec <pod> -n <namespace> -c {SIDECAR_CONTAINER} -- {self.command_line()}"

    @property
    def anchor(self) -> str:
        """The runbook section's anchor (its heading, as GitHub and mkdocs make it)."""
        return self.alert.lower()

    def runbook(self, runbook_url: str = "") -> str:
        """The runbook section's address: ``runbook_url#anchor``, else its place in a checkout."""
        return f"{runbook_url or RUNBOOK_DOC}#{self.anchor}"


NEXT_STEPS: dict[Concern, NextStep] = {
    Concern.DIED: NextStep(
        "the engine died: fix the part that grew (declare the cache that grew, fix the leak of live tensors, find "
        "the allocation outside torch), or size the engine for it (`plan`); keep this post-mortem before a restart "
        "replaces its snapshot",
        "inspect",
        "why it died, its memory by part then, and what grew since its baseline",
        "ModelKVEngineOutOfMemory",
    ),
    Concern.VANISHED: NextStep(
        "the engine's process was killed without ending its snapshot (SIGKILL, the kernel's OOM killer, the "
        "container's memory limit: `kubectl describe pod` says OOMKilled); its last figures are kept: compare what "
        "grew with the container's memory limit and the device's memory",
        "inspect",
        "its last snapshot, its memory by part and what grew since its baseline",
        "ModelKVSnapshotStale",
    ),
    Concern.STALE: NextStep(
        "the engine stopped publishing: look at its process or pod (hung, restarting, killed for memory); its last "
        "figures are kept but no longer exported",
        "inspect",
        "its last snapshot",
        "ModelKVSnapshotStale",
    ),
    Concern.UNDER_REPORTS: NextStep(
        "declare what the owner's caches hold: change its model_local_kv_specs() to the suggested declaration (sized "
        "to what they held; `check` prints it); until then `plan` plans from what they held",
        "check",
        "each owner's verdict and the declaration to write, with its evidence",
        "ModelKVDeclarationUnderReports",
    ),
    Concern.UNDECLARED: NextStep(
        "declare the cache: add model_local_kv_specs() to the module's class (`check` suggests a declaration where "
        "its key/value layout was seen; else modelkv_exporter.testing on the model writes one); until then `plan` "
        "counts it as fixed bytes",
        "check",
        "each owner's verdict and the declaration to write, with its evidence",
        "ModelKVUndeclaredCache",
    ),
    Concern.DROPPED: NextStep(
        "fix the owner's model_local_kv_specs(): it raised, or returned specs the engine could not use (the error "
        "is in the engine's details); its caches are not counted until then",
        "check",
        "each dropped declaration with its error",
        "ModelKVDeclarationsDropped",
    ),
    Concern.UNUSED: NextStep(
        "the owner runs without the cache it declares: remove the declaration if that code path is gone, or find "
        "why the cache is not built",
        "check",
        "each owner's verdict",
        "ModelKVDeclaredCacheUnused",
    ),
    Concern.GROWTH: NextStep(
        "find what holds the memory: ModelKVUndeclaredMemoryGrowth fires once this lasts 15 minutes (on a CPU "
        "engine, while it keeps rising). Growing live tensors are a leak or a cache nothing declares (compare "
        "two `inspect` runs, look for undeclared caches); non-torch growth is memory allocated outside torch "
        "(an extension, NCCL); a cache the model keeps on purpose is fixed by declaring it",
        "inspect",
        "its growth since baseline by part",
        "ModelKVUndeclaredMemoryGrowth",
    ),
    Concern.NO_ENGINE: NextStep(
        "no engine beside this sidecar publishes. In the engine's container: vLLM loads the plugin when "
        "`VLLM_PLUGINS` is unset or names modelkv_exporter "
        "(`kubectl exec <pod> -n <namespace> -c <engine> -- printenv VLLM_PLUGINS`); the engine's image must have "
        "the package (`kubectl exec <pod> -n <namespace> -c <engine> -- python -c 'import modelkv_exporter'`); the "
        "engine must write into this sidecar's spool "
        "(`kubectl exec <pod> -n <namespace> -c <engine> -- printenv MODELKV_SPOOL_DIR`: one volume mounted in both "
        "containers at that directory)",
        "inspect",
        "the spool's files: none while no engine publishes",
        "ModelKVNoEnginePublishing",
    ),
}
"""The next step of each concern: written once, for the page, ``inspect``, ``plan`` and the demo."""


@dataclass(frozen=True)
class Problem:
    """One owner's part of a finding (or the engine's, for a stale heartbeat): what is wrong, in one sentence,
    and the figures of a declaration that would fix it, where the snapshot shows enough to write one."""

    owner: str | None
    """The module path (``""`` is the root module); None when the finding is about the engine as a whole."""
    owner_class: str
    text: str
    figures: tuple[Figure, ...] | None = None

    @property
    def suggestion(self) -> str | None:
        """The suggested declaration as code (``judging.declaration_text``), or None."""
        return None if self.figures is None else spec_code(self.figures)


@dataclass(frozen=True)
class Finding:
    """One concern about one engine: every owner it is about, and what to do next."""

    concern: Concern
    problems: tuple[Problem, ...]

    @property
    def detail(self) -> str:
        """The problems in one line: the first ``NAMED``, then how many more."""
        return listed([p.text for p in self.problems])

    @property
    def step(self) -> NextStep:
        """What to do about it."""
        return NEXT_STEPS[self.concern]


def owner_name(owner: str) -> str:
    """A module path as reports print it: the root module as ``ROOT_OWNER``."""
    return owner or ROOT_OWNER


def listed(items: Sequence[str]) -> str:
    """The first ``NAMED`` of ``items``, then how many more."""
    named = "; ".join(items[:NAMED])
    return named if len(items) <= NAMED else f"{named}; and {len(items) - NAMED} more"


def holds_over(observed: int, declared: int) -> str:
    """What an under-reporting owner holds: ``holds 1.50× its declaration (53.2 MiB observed, 35.5 MiB declared)``."""
    return (
        f"holds {observed / declared:.2f}× its declaration "
        f"({human_bytes(observed)} observed, {human_bytes(declared)} declared)"
    )


def holds_undeclared(held: int, beyond_declared: bool = False) -> str:
    """What an owner holds that it does not declare: ``holds 70.3 MiB it does not declare``."""
    return f"holds {human_bytes(held)} " + ("beyond its declared caches" if beyond_declared else "it does not declare")


def over_declaration(owner: str, observed: int, declared: int) -> str:
    """The under-reporting sentence: ``tokenizer.decoder holds 1.50× its declaration (53.2 MiB observed, ...)``."""
    return f"{owner_name(owner)} {holds_over(observed, declared)}"


def undeclared_text(owner: str, owner_class: str, held: int, beyond_declared: bool = False) -> str:
    """The undeclared-cache sentence: ``apm.streaming_kv (StreamingAudioKVCache) holds 70.3 MiB it does not
    declare``."""
    who = owner_name(owner) + (f" ({owner_class})" if owner_class else "")
    return f"{who} {holds_undeclared(held, beyond_declared)}"


def _under_reports(snapshot: Snapshot) -> tuple[list[Problem], list[Problem]]:
    """Owners observed above their declaration, and declaring-side owners observed holding caches they declare none
    of (an observation without a declaration)."""
    over, undeclared = [], []
    for owner, observation in snapshot.owners().items():
        if observation is None or not observation.available or not observation.peak_bytes:
            continue
        declared, peak = snapshot.declared_peak_of(owner), observation.peak_bytes
        declarations = [d for d in snapshot.declarations if d.owner == owner]
        owner_class = declarations[0].owner_class if declarations else observation.owner_class
        if not declared:
            undeclared.append(Problem(owner, owner_class, undeclared_text(owner, owner_class, peak)))
        elif peak > UNDER_REPORT_TOLERANCE * declared:
            figures = resized_figures(owner, peak, declarations)
            over.append(Problem(owner, owner_class, over_declaration(owner, peak, declared), figures))
    return over, undeclared


def _discovered(found: DiscoveredOwner) -> Problem:
    figures = None if found.layout is None else layout_figures(found.owner, found.peak_bytes, found.layout)
    text = undeclared_text(found.owner, found.owner_class, found.peak_bytes, found.declares)
    return Problem(found.owner, found.owner_class, text, figures)


def _unused(snapshot: Snapshot) -> list[Problem]:
    found = []
    for owner, observation in snapshot.owners().items():
        if observation is None or not observation.available or not snapshot.declared_peak_of(owner):
            continue
        if (observation.calls or 0) >= UNUSED_MIN_CALLS and observation.cache_calls == 0:
            text = f"{owner_name(owner)} was called {observation.calls} times and never used a cache"
            found.append(Problem(owner, observation.owner_class, text))
    return found


def growth_text(judged: Growth) -> str:
    """The growth sentence: ``700.0 MiB since baseline that nothing explains (live tensors +700.0 MiB, ...)``."""
    parts = []
    if judged.live_tensors is not None:
        parts.append(f"live tensors {signed_bytes(judged.live_tensors, '+')}")
        if judged.non_torch is not None:
            parts.append(f"outside torch {signed_bytes(judged.non_torch, '+')}")
    elif judged.resident is not None:
        parts.append(f"resident memory {signed_bytes(judged.resident, '+')}")
    parts.append(f"caches explain {human_bytes(judged.explained)}")
    return (
        f"{human_bytes(judged.unexplained or 0)} since baseline that neither the memory profile nor the caches "
        f"explain ({', '.join(parts)}; the alert's threshold is {human_bytes(UNDECLARED_GROWTH_BYTES)})"
    )


def declaration_findings(snapshot: Snapshot) -> list[Finding]:
    """What is wrong with the snapshot's declarations, whatever the engine's state (``plan`` and ``inspect`` judge
    ended engines too); no stale heartbeat."""
    found: list[Finding] = []
    over, undeclared = _under_reports(snapshot)
    if discovery_running(snapshot):
        undeclared += [_discovered(d) for d in snapshot.discovered]
    if over:
        found.append(Finding(Concern.UNDER_REPORTS, tuple(over)))
    if undeclared:
        found.append(Finding(Concern.UNDECLARED, tuple(undeclared)))
    if snapshot.dropped_count:
        dropped = tuple(
            Problem(d.owner, d.owner_class, f"{d.count} of {owner_name(d.owner)} ({d.reason}: {d.error})")
            for d in snapshot.dropped_declarations or ()
        )
        found.append(Finding(Concern.DROPPED, dropped))
    if unused := _unused(snapshot):
        found.append(Finding(Concern.UNUSED, tuple(unused)))
    return found


def findings(snapshot: Snapshot, state: EngineState, now: float, *, ended_too: bool = False) -> list[Finding]:
    """Everything about an exported, stale or vanished engine that needs attention, and first why an engine died
    (``post_mortem``); nothing else for an ended or forgotten one, unless ``ended_too`` (a report of a finished run
    judges what its engines left)."""
    found: list[Finding] = []
    dead = post_mortem(snapshot, state)
    if dead is not None:
        concern = Concern.VANISHED if state is EngineState.VANISHED else Concern.DIED
        found.append(Finding(concern, (Problem(None, "", dead.headline()),)))
    if state not in (EngineState.EXPORTED, *STALE_STATES) and not ended_too:
        return found
    if state is EngineState.STALE:
        age = max(now - snapshot.heartbeat_at, 0)
        stale = Problem(None, "", f"no heartbeat for {age:.0f} s; its figures are no longer exported")
        found.append(Finding(Concern.STALE, (stale,)))
    found += declaration_findings(snapshot)
    judged = growth(snapshot) if state not in STALE_STATES else None
    if judged is not None and judged.over_threshold:
        found.append(Finding(Concern.GROWTH, (Problem(None, "", growth_text(judged)),)))
    return found


def status(state: EngineState, found: Sequence[Finding]) -> Status:
    """One word for the engines table: died (or vanished) before all, then stale before attention, attention before
    ok."""
    if any(f.concern in (Concern.DIED, Concern.VANISHED) for f in found):
        return Status.DIED
    if state is EngineState.ENDED:
        return Status.ENDED
    if state is EngineState.FORGOTTEN:
        return Status.FORGOTTEN
    if state in STALE_STATES:
        return Status.STALE
    return Status.ATTENTION if found else Status.OK


def no_engine(view: SpoolView, up_for: float | None = None) -> Finding | None:
    """That no engine publishes into a readable spool that holds no file at all (None when one does, or the spool
    cannot be read: that is its own finding). ``up_for``: seconds the exporter has run, where known; the finding
    holds before ``NO_ENGINE_SECONDS`` too (``waiting`` tells the two apart)."""
    if view.scan.error or view.scan.skipped or view.entries:
        return None
    since = "" if up_for is None else f" in the {max(up_for, 0) / 60:.0f} min since this exporter started"
    text = f"no engine has published a snapshot into the spool{since}; an engine publishes once its model is loaded"
    return Finding(Concern.NO_ENGINE, (Problem(None, "", text),))


def waiting(up_for: float | None) -> bool:
    """Whether an exporter that has run ``up_for`` seconds may still be waiting for its engine's first snapshot."""
    return up_for is not None and up_for < NO_ENGINE_SECONDS
