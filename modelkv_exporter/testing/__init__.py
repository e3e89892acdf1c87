"""A model author's check: do my declarations hold what my caches hold, and what should they say?

Wrap a model, drive it with your own code, read the report::

    from modelkv_exporter.testing import observe

    with observe(model, max_num_seqs=2) as run:
        for size in (1, 2):
            with run.batch(size):
                drive(model, size)
    run.report.assert_ok()   # AssertionError naming each wrong owner and field, with a declaration to paste

Three ways in, one list of keywords (``CheckSettings``): ``check(model, drive, max_num_seqs=2,
batches=(1, 2))`` does it in one call, ``observe(model, ...)`` is its context-manager form (above),
and the pytest fixture ``model_local_kv`` (registered by the ``pytest11`` entry point) asserts it.
Engine side: needs torch and transformers (``pip install '.[torch]'``), no GPU. See
docs/declaring-caches.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modelkv_exporter.judging.verdicts import Verdict, VerdictKind
    from modelkv_exporter.testing.diagnosis import FieldProblem as FieldProblem
    from modelkv_exporter.testing.layout import CallPeak as CallPeak
    from modelkv_exporter.testing.layout import LayerGroup as LayerGroup
    from modelkv_exporter.testing.report import OwnerReport, Report, Suggestion
    from modelkv_exporter.testing.run import CacheCheck as CacheCheck
    from modelkv_exporter.testing.run import CheckSettings, check, observe

_HOMES = {
    "CacheCheck": "run",
    "CheckSettings": "run",
    "check": "run",
    "observe": "run",
    "OwnerReport": "report",
    "Report": "report",
    "Suggestion": "report",
    "FieldProblem": "diagnosis",
    "CallPeak": "layout",
    "LayerGroup": "layout",
}
"""Where each public name lives; imported on first use, so that loading the pytest plugin imports no torch."""

__all__ = [
    "CheckSettings",
    "OwnerReport",
    "Report",
    "Suggestion",
    "Verdict",
    "VerdictKind",
    "check",
    "observe",
]
"""The surface: ``CacheCheck``, ``CallPeak``, ``FieldProblem`` and ``LayerGroup`` still import from here (what
a report holds), but are not part of it."""


def __getattr__(name: str) -> Any:
    if name in ("Verdict", "VerdictKind"):
        return getattr(importlib.import_module("modelkv_exporter.judging.verdicts"), name)
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
