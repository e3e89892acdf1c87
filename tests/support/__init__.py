"""What only the tests share; what ``bench/`` and ``scripts/`` use too is in ``modelkv_testbed`` (``testbed/``).

Modules: ``demo_engines`` (the demo's engines in processes), ``discovered`` (snapshots with discovered owners),
``grafana_schema`` and ``typescript`` (the dashboards against Grafana's schema), ``observed_engine`` (an engine
process with the observer), ``podman`` (images and containers), ``vllm_wheel`` (vLLM's published wheels).
"""

from __future__ import annotations

import os

FULL_SCALE = os.environ.get("MODELKV_TEST_SCALE") == "full"
"""bench/reliability.sh sets MODELKV_TEST_SCALE=full: the reliability tests then run at the issue's full size."""
