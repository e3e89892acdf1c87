"""The rule file's alerts hold whatever order its groups evaluate in (docs/deploy.md, "Rule evaluation and scaling").

A Prometheus evaluates each group at an offset of its own in the interval, and Thanos's and Mimir's rulers place
groups in different processes, so a group reads another group's result of this interval or of the last. Two
properties keep the alerts the same either way, and both are held here: every rule reads its figures from one time
(raw series and its own group's results, or one other group's results alone; an engine's identity, the ``:info``
series, crosses groups as a filter or a join), and every rule test and story, the restart in place among them, passes
in one order of each class of orders that can compute differently (``modelkv_testbed.rule_order``: 8 classes of the
5 040 orders). Breaking the first on purpose (the leak signal back in ``modelkv.rules``, read beside
``modelkv.caches``' own figures) makes the restart story fail in the orders where the caches evaluate first.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelkv_testbed.promql import RULE_TESTS, RULES_FILE, rule_groups
from modelkv_testbed.rule_order import cross_group_reads, distinct_orders, fresh_reads, read_names
from tests.deploy.test_rules import promtool_test

pytestmark = pytest.mark.slow

RESTART_STORY = RULES_FILE.parent / "tests" / "story-o-restart-in-place.test.yaml"
LEAK_SIGNAL = (
    "modelkv_engine:live_tensor_growth_bytes",
    "modelkv_engine:non_torch_growth_bytes",
    "modelkv_engine:unplanned_growth_bytes",
)
"""The records of the leak signal, which ``modelkv.caches`` combines with what the caches explain."""


def in_every_order(rules_text: str, only: str, directory: Path) -> dict[tuple[str, ...], str]:
    """Per order of each class, what promtool said of the rule tests named ``only`` ('' when they passed); two runs
    at a time."""
    orders = distinct_orders(yaml.safe_load(rules_text)["groups"])

    def run(k: int) -> str:
        done = promtool_test(rules_text, directory / f"order-{k}", only, orders[k])
        return "" if done.returncode == 0 else done.stdout + done.stderr

    with ThreadPoolExecutor(2) as pool:
        return {tuple(order): said for order, said in zip(orders, pool.map(run, range(len(orders))), strict=True)}


def with_leak_signal_in_rules() -> str:
    """The rule file with the leak signal's records moved to the end of ``modelkv.rules``, as it once was."""
    document: dict[str, Any] = yaml.safe_load(RULES_FILE.read_text())
    by_name = {group["name"]: group for group in document["groups"]}
    moved = [rule for rule in by_name["modelkv.caches"]["rules"] if rule.get("record") in LEAK_SIGNAL]
    assert len(moved) == len(LEAK_SIGNAL), "the leak signal is no longer in modelkv.caches"
    by_name["modelkv.caches"]["rules"] = [r for r in by_name["modelkv.caches"]["rules"] if r not in moved]
    by_name["modelkv.rules"]["rules"] += moved
    return yaml.safe_dump(document, sort_keys=False)


NOW = "raw series and its own group"
"""The time source of a rule that reads raw series or its own group's results: this evaluation."""


def time_sources(groups: Sequence[dict[str, Any]]) -> dict[str, set[str]]:
    """Per rule (its record or alert name, with its group), where its figures come from: ``NOW``, or another group
    whose results it reads (this interval's or the last one's). An engine's identity (a ``:info`` series) is a filter
    or a join, not a figure, and has no time source."""
    writer = {rule["record"]: group["name"] for group in groups for rule in group["rules"] if "record" in rule}
    sources: dict[str, set[str]] = {}
    for group in groups:
        for rule in group["rules"]:
            key = f"{group['name']} {rule.get('record') or rule['alert']}"
            for name in read_names(rule["expr"]):
                source = writer.get(name, group["name"])
                if source == group["name"]:
                    sources.setdefault(key, set()).add(NOW)
                elif not name.endswith(":info"):
                    sources.setdefault(key, set()).add(source)
    return sources


def mixed_times(groups: Sequence[dict[str, Any]]) -> dict[str, set[str]]:
    """The rules that combine figures of two times (one group's result beside fresher figures, or two groups')."""
    return {rule: found for rule, found in time_sources(groups).items() if len(found) > 1}


def with_device_alert_reading(extra: str) -> str:
    """The rule file with ModelKVDeclaredPeakWillNotFit also reading ``extra`` (a raw series)."""
    document: dict[str, Any] = yaml.safe_load(RULES_FILE.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "ModelKVDeclaredPeakWillNotFit":
                rule["expr"] = f"({rule['expr']}) and on (device, device_key) {extra}"
    return yaml.safe_dump(document, sort_keys=False)


def test_every_rule_reads_its_figures_from_one_time() -> None:
    """Raw series and its own group's results, or one other group's results alone: never this interval's figures
    beside a result that may be one interval old."""
    groups = rule_groups()
    assert mixed_times(groups) == {}
    sources = time_sources(groups)
    assert sources["modelkv.alerts ModelKVDeclaredPeakWillNotFit"] == {"modelkv.devices"}, "read across groups"
    assert cross_group_reads(groups), "the groups read each other's identity series"
    broken = yaml.safe_load(with_leak_signal_in_rules())["groups"]
    assert mixed_times(broken) == {"modelkv.caches modelkv_engine:undeclared_memory_bytes": {NOW, "modelkv.rules"}}, (
        "a late figure beside a fresh one is named"
    )
    fresh_beside_late = yaml.safe_load(with_device_alert_reading("modelkv_memory_device_total_bytes"))["groups"]
    assert mixed_times(fresh_beside_late) == {"modelkv.alerts ModelKVDeclaredPeakWillNotFit": {NOW, "modelkv.devices"}}


def test_one_order_of_each_class_stands_for_all_5040() -> None:
    """Each order of the groups finds the same fresh reads as one of the orders run; the file's order and its reverse
    are among them."""
    groups = rule_groups()
    names = [g["name"] for g in groups]
    reads = sorted(cross_group_reads(groups))
    orders = distinct_orders(groups)
    assert orders[:2] == [names, names[::-1]]
    classes = {fresh_reads(order, reads) for order in orders}
    assert len(classes) == len(orders) == 8
    assert {fresh_reads(order, reads) for order in itertools.permutations(names)} == classes
    assert len(distinct_orders(yaml.safe_load(with_leak_signal_in_rules())["groups"])) == 8, "the same reads"


@pytest.fixture(scope="module")
def every_order(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], str]:
    return in_every_order(RULES_FILE.read_text(), "", tmp_path_factory.mktemp("orders"))


def test_every_rule_test_and_story_passes_in_every_order(every_order: dict[tuple[str, ...], str]) -> None:
    assert len(RULE_TESTS) >= 4 and RESTART_STORY in RULE_TESTS
    failed = {" ".join(order): said[-3000:] for order, said in every_order.items() if said}
    assert failed == {}


def test_the_restart_story_fails_when_the_caches_read_the_leak_signal_of_another_group(tmp_path: Path) -> None:
    """Broken on purpose: with the leak signal in ``modelkv.rules``, an order that evaluates ``modelkv.caches`` first
    sets the old process's growth against the new process's caches in the minute of the restart. The CPU engine's
    undeclared memory then shows 1 GiB it does not hold (which a `max_over_time` of it keeps); the file's order, which
    the tests used to pin, shows nothing."""
    said = in_every_order(with_leak_signal_in_rules(), RESTART_STORY.name, tmp_path)
    names = [g["name"] for g in rule_groups()]
    caches_first = {o for o in said if o.index("modelkv.caches") < o.index("modelkv.rules")}
    assert said[tuple(names)] == "", "in the file's order the broken file passes: pinning the order hid it"
    assert caches_first and all('engine="restart-cpu"' in said[o] for o in caches_first), said
    assert all(said[o] == "" for o in said if o not in caches_first)
