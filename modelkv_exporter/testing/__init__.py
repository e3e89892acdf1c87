"""A model author's check: do my declarations hold what my caches hold, and what should they say?

Wrap a model, drive it with your own code, read the report::

    from modelkv_exporter.testing import observe

    with observe(model, max_num_seqs=2) as run:
        for size in (1, 2):
            with run.batch(size):
                drive(model, size)
    run.report.assert_ok()   # AssertionError naming each wrong owner and field, with a declaration to paste

``check(model, drive, max_num_seqs=2, batches=(1, 2))`` does the same in one call, and the pytest
fixture ``model_local_kv`` (``pytest_plugins = ["modelkv_exporter.testing.pytest_plugin"]``)
asserts it. Engine side: needs torch and transformers (``pip install '.[torch]'``), no GPU.
See docs/declaring-caches.md.
"""

from modelkv_exporter.contract.verdicts import Verdict, VerdictKind
from modelkv_exporter.testing.diagnosis import FieldProblem
from modelkv_exporter.testing.layout import CallPeak, LayerGroup
from modelkv_exporter.testing.report import OwnerReport, Report, Suggestion
from modelkv_exporter.testing.run import CacheCheck, check, observe

__all__ = [
    "CacheCheck",
    "CallPeak",
    "FieldProblem",
    "LayerGroup",
    "OwnerReport",
    "Report",
    "Suggestion",
    "Verdict",
    "VerdictKind",
    "check",
    "observe",
]
