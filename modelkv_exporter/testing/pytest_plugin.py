"""A pytest fixture that makes the model author's check one line: ``model_local_kv``.

Registered through the ``pytest11`` entry point: installed with modelkv-exporter, the fixture is
there in every test run, with no ``conftest.py`` line::

    def test_my_decoder_declares_what_it_holds(model_local_kv):
        model_local_kv(build_decoder(), drive, max_num_seqs=2, batches=(1, 2))

``pytest_plugins = ["modelkv_exporter.testing.pytest_plugin"]`` keeps working (the entry point is
named after this module, so pytest finds it loaded already); ``-p no:modelkv_exporter.testing.pytest_plugin``
turns it off. The fixture runs ``modelkv_exporter.testing.check`` and asserts the report: the failure
shows what fails first, then the whole report (verdicts, wrong fields, the suggested declaration),
with the check's own frames hidden; it returns the report when it passes. Loading the plugin imports
only pytest: nothing of torch until the fixture is used. No GPU is needed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def model_local_kv() -> Iterator[Callable[..., Any]]:
    """``model_local_kv(model, drive, *, max_num_seqs, batches=(), ...)``: ``check`` (its signature, so that a
    keyword it does not take is a ``TypeError`` before the model runs), then the report asserted and returned."""
    from modelkv_exporter.testing.run import check

    @functools.wraps(check)
    def run(*args: Any, **keywords: Any) -> Any:
        __tracebackhide__ = True
        return check(*args, **keywords).assert_ok()

    yield run
