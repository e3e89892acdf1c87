"""A model author's check: do my declarations hold what my caches hold, and what should they say?

Wrap a model, drive it with your own code, read the report::

    from modelkv_exporter.testing import observe

    with observe(model, max_num_seqs=2) as run:
        for size in (1, 2):
            with run.batch(size):
                drive(model, size)
    run.report.assert_ok()   # AssertionError naming each wrong owner and field, with a declaration to paste

Three ways in, one list of keyword-only parameters (``CheckSettings``'s fields; a keyword none of them is raises
``TypeError`` before the model runs): ``check(model, drive, max_num_seqs=2, batches=(1, 2))`` does it in one
call, ``observe(model, ...)`` is its context-manager form (above), and the pytest fixture ``model_local_kv``
(registered by the ``pytest11`` entry point) asserts it.
Engine side: needs torch and transformers (``pip install '.[torch]'``), no GPU. See
docs/declaring-caches.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modelkv_exporter.judging.verdicts import Verdict, VerdictKind
    from modelkv_exporter.testing.report import OwnerReport, Report, Suggestion
    from modelkv_exporter.testing.run import CheckSettings, check, observe

__all__ = ["CheckSettings", "OwnerReport", "Report", "Suggestion", "Verdict", "VerdictKind", "check", "observe"]
"""The surface, as the imports above give it to type checkers; at run time each name is imported on first use
from the first of ``_HOMES`` that holds it, so that loading the pytest plugin imports no torch."""

_HOMES = ("modelkv_exporter.testing.report", "modelkv_exporter.judging.verdicts", "modelkv_exporter.testing.run")


def __getattr__(name: str) -> Any:
    if name in __all__:
        for home in _HOMES:
            found = vars(importlib.import_module(home))
            if name in found:
                return found[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
