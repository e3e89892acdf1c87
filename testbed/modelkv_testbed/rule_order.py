"""The orders a rule file's groups can evaluate in, as far as they can change what the rules compute.

Prometheus evaluates each group at an offset of its own in the interval, and a ruler (Thanos, Mimir) may place
groups in different processes: a group that reads another group's result reads the one of this interval or of the
last, depending on which evaluated first. At one evaluation time, two orders of the groups compute the same thing
whenever every group finds the same groups before it among those whose results it reads; so the orders fall into
classes by *which cross-group reads are fresh*, and one order per class stands for all of them (promtool's
``group_eval_order`` then runs exactly what any order of that class would). Seven groups have 5 040 orders; this
rule file's reads give a handful of classes.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

from modelkv_testbed.promql import metric_names

Read = tuple[str, str]
"""A group that reads another group's results: (reader, writer)."""

_NAME_REGEX = re.compile(r'__name__\s*=~?\s*"([^"]*)"')


def read_names(expr: str) -> set[str]:
    """The series an expression reads: selected by name, or by ``__name__`` (an alternation of names)."""
    named = {name for found in _NAME_REGEX.findall(expr) for name in found.split("|")}
    return metric_names(expr) | named


def cross_group_reads(groups: Sequence[dict[str, Any]]) -> dict[Read, set[str]]:
    """For each group that reads another group's recorded series: which series, by (reader, writer)."""
    writer = {rule["record"]: group["name"] for group in groups for rule in group["rules"] if "record" in rule}
    reads: dict[Read, set[str]] = {}
    for group in groups:
        for rule in group["rules"]:
            for name in read_names(rule["expr"]):
                if name in writer and writer[name] != group["name"]:
                    reads.setdefault((group["name"], writer[name]), set()).add(name)
    return reads


def fresh_reads(order: Sequence[str], reads: Sequence[Read]) -> frozenset[Read]:
    """The reads that find this evaluation's result in ``order``: the writer evaluates before the reader."""
    position = {name: i for i, name in enumerate(order)}
    return frozenset((reader, writer) for reader, writer in reads if position[writer] < position[reader])


def distinct_orders(groups: Sequence[dict[str, Any]]) -> list[list[str]]:
    """One order of the groups per class of orders that compute alike: the file's order first, its reverse second,
    then the first order (in lexicographic order of positions) of each other class."""
    names = [group["name"] for group in groups]
    reads = sorted(cross_group_reads(groups))
    chosen: dict[frozenset[Read], list[str]] = {}
    for order in [names, names[::-1], *(list(p) for p in itertools.permutations(names))]:
        chosen.setdefault(fresh_reads(order, reads), order)
    return list(chosen.values())


def with_order(test_text: str, order: Sequence[str]) -> str:
    """A promtool test file's text that evaluates the groups in ``order`` (``group_eval_order``)."""
    listed = ", ".join(order)
    return re.sub(r"^rule_files:", f"group_eval_order: [{listed}]\nrule_files:", test_text, count=1, flags=re.M)
