"""A pytest fixture that makes the model author's check one line: ``model_local_kv``.

Load it from a ``conftest.py`` (or the test module)::

    pytest_plugins = ["modelkv_exporter.testing.pytest_plugin"]

    def test_my_decoder_declares_what_it_holds(model_local_kv):
        model_local_kv(build_decoder(), drive, max_num_seqs=2, batches=(1, 2))

The fixture runs ``modelkv_exporter.testing.check`` and asserts the report (the failure shows
it whole: verdicts, wrong fields, the suggested declaration); it returns the report when it
passes. Nothing of torch is imported until the fixture is used, so loading the plugin costs a
test run nothing. No GPU is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def model_local_kv() -> Iterator[Callable[..., Any]]:
    """``model_local_kv(model, drive, *, max_num_seqs, batches=(), owners=(), discovery=None)``: check, assert, report."""
    from modelkv_exporter.testing.run import check

    def run(model: object, drive: Callable[..., object], **options: Any) -> Any:
        report = check(model, drive, **options)
        return report.assert_ok()

    yield run
