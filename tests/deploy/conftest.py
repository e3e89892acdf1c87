"""Fixtures the rule tests share."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from modelkv_testbed.promql import RULES_FILE, rule_groups
from tests.deploy.test_rules import promtool_test


@pytest.fixture(scope="session")
def passes_intact(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], bool]:
    """Whether the rule tests named by its argument pass against the rule file as it is, in file order: asked once
    per file for every break of the rules that file must catch."""
    order = [g["name"] for g in rule_groups()]

    @functools.cache
    def passes(test_file: str) -> bool:
        directory = tmp_path_factory.mktemp("intact")
        return promtool_test(RULES_FILE.read_text(), directory, test_file, group_order=order).returncode == 0

    return passes
