"""The thresholds and tolerances that judge an engine: each defined here once.

The alerts (``deploy/prometheus/modelkv-rules.yaml``), the Helm chart's defaults (generated from the
rule file), the dashboards' threshold line and the landing page's findings
(``sidecar.attention``) all judge by these numbers. PromQL cannot import them: the rule file writes
each as a number, and ``tests/deploy/test_rules.py`` reads every one back from the rules and the
chart and compares it with this module, so a number changed in one place alone fails the tests.

Where a judge differs on purpose (``check`` names any excess an under-report, because it hands the
model author a declaration that holds), docs/runbook.md says why, in one table.
"""

from __future__ import annotations

MIB = 1024 * 1024

UNDER_REPORT_TOLERANCE = 1.05
"""An owner whose observed peak exceeds its declared peak times this under-reports (5 % tolerance)."""

UNDECLARED_GROWTH_BYTES = 256 * MIB
"""Unplanned, unexplained growth of an engine beyond which ``ModelKVUndeclaredMemoryGrowth`` fires."""

RISING_MIN_STEP_BYTES = 20 * MIB
"""The least a CPU engine's undeclared memory must rise by, in each step of ``ModelKVUndeclaredMemoryGrowth``'s "still
rising" test, to count as rising: above a settled heap's jitter (16 MiB), below a 5 MiB-a-minute leak's 5 minutes."""

UNDECLARED_CACHE_BYTES = 64 * MIB
"""Bytes an owner that declares nothing must have kept in caches discovery found for ``ModelKVUndeclaredCache``."""

UNUSED_MIN_CALLS = 10
"""Calls into an owner after which a declared cache that no call used is reported (``ModelKVDeclaredCacheUnused``)."""

NO_ENGINE_SECONDS = 30 * 60
"""Seconds an exporter may run with no snapshot in its spool before no engine publishing is a problem
(``ModelKVNoEnginePublishing``'s ``for``): longer than an engine takes to load its model and publish its first."""

PRESCRIPTION_MARGIN_RATIO = 0.02
"""The share of an engine's requested memory (vLLM's ``requested_memory``: the device's total ×
gpu_memory_utilization) the prescription (``sidecar.prescription``) keeps free beyond every measured part: for what
moves between samples and what one snapshot cannot see (torch's fragmentation, an activation peak above those
sampled, a request longer than any served yet). No rule reads it; docs/prescription.md says why 2 %."""
