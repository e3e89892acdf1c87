"""The author's check takes explicit keyword-only parameters: a misspelled keyword is a ``TypeError`` before the
model runs, in ``check``, ``observe`` and the pytest fixture alike, and all three take the same keywords."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch import nn

import modelkv_exporter.testing as surface
from modelkv_exporter.engine.observe import installed
from modelkv_exporter.testing import CheckSettings, check, observe


def _keywords(function: Callable[..., Any]) -> dict[str, Any]:
    parameters = inspect.signature(function).parameters.values()
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in parameters), f"{function.__name__} takes **"
    return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


SETTINGS = {
    field.name: inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
    for field in dataclasses.fields(CheckSettings)
}


def test_check_observe_and_the_fixture_take_the_settings_as_keywords(model_local_kv: Callable[..., Any]) -> None:
    assert _keywords(observe) == SETTINGS
    assert _keywords(check) == {**SETTINGS, "batches": ()}
    assert _keywords(model_local_kv) == _keywords(check)


def test_a_misspelled_keyword_is_a_type_error_before_anything_runs(model_local_kv: Callable[..., Any]) -> None:
    driven: list[object] = []
    model = nn.Linear(2, 2)
    for call in (
        lambda: check(model, driven.append, max_num_seq=2),
        lambda: check(model, driven.append, max_num_seqs=2, batch=(1, 2)),
        lambda: model_local_kv(model, driven.append, max_num_seqs=2, owner=("x",)),
        lambda: observe(model, max_num_seqs=2, census_floor=1),
    ):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            call()
    assert driven == [] and installed() is None


def test_the_check_runs_on_the_settings_it_was_given() -> None:
    """``CacheCheck`` holds the settings once and reads them there (it copies none)."""
    run = observe(nn.Linear(2, 2), max_num_seqs=3, owners=["a"], discover=False)
    assert run.settings == CheckSettings(max_num_seqs=3, owners=("a",), discover=False)
    assert not {"max_num_seqs", "named", "discover", "discovery", "census_floor_bytes"} & set(vars(run))


def test_the_package_spells_its_surface_in_its_imports_and_all_and_offers_nothing_else() -> None:
    tree = ast.parse(Path(surface.__file__).read_text())
    (block,) = [node for node in tree.body if isinstance(node, ast.If)]
    imported = [alias.asname or alias.name for node in block.body for alias in getattr(node, "names", ())]
    assert sorted(imported) == sorted(surface.__all__)
    assert all(getattr(surface, name) is not None for name in surface.__all__)
    for name in ("CacheCheck", "CallPeak", "FieldProblem", "LayerGroup", "logger"):
        with pytest.raises(AttributeError):
            getattr(surface, name)
