"""What the tests, ``bench/`` and ``scripts/`` share: a small distribution of its own, never shipped.

It lives in the repository (``testbed/``, installed editable by ``make test``) and never in the exporter's wheel or
image. Its modules:

- ``simulation``: engines and devices minute by minute, rendered through the sidecar's own sample functions (the
  rules' story tests, ``bench/rules_fleet.py``);
- ``snapshots``: valid snapshots and declarations, built without torch; ``worst_spool``: the worst spool the default
  budgets admit; ``scenario``: a spool with every situation the rules and dashboards watch for;
- ``processes``: the real sidecar CLI and tools on 127.0.0.1; ``polling``: the one way to wait;
- ``exposition``: reading an exposition; ``promql``: the PromQL this project ships; ``rule_order``: the orders of
  the rule groups that can compute differently;
- ``prometheus``, ``victoria``, ``browser``: real Prometheus, VictoriaMetrics and vmalert, headless Chromium;
- ``tiny_model``: tiny random checkpoints made locally, for real vLLM engines;
- ``hot_path_scenes``: an observed owner's many layers, a heartbeat sampling and a model thread updating beside it
  (the engine's hot-path tests and bench), and the scenes that can hang, each in a process of its own;
- ``bench_tables``: the marked tables of docs/benchmarks.md's "Today" section, which each bench rewrites.

Its libraries (httpx, pytest, PyYAML, prometheus-client, torch where a module needs it) come from the test
requirements it is installed beside; it declares none, so that installing it changes no pin of an environment.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root (the package is installed editable from ``testbed/``)."""

VENV_BIN = Path(sys.executable).parent
"""The running environment's scripts (``modelkv-exporter``, ``ruff``)."""
