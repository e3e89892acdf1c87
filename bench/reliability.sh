#!/usr/bin/env bash
# Reliability at full size (docs/reliability.md).
# 1. The reliability tests: spools holding 10 000 hostile documents, 1 000 writers killed
#    mid-write under continuous scrapes, 60 s of 16 concurrent scrapers while writers beat
#    every second, and the hardening tests (hostile clients, budgets, probes). They print their figures (-s).
# 2. bench/attack.py: every attack of the hardening issue at its full size against the real
#    sidecar (wrk from Debian, pinned with taskset), and the worst admitted spool under
#    4 000 clients. Arguments go to attack.py (e.g. --only worst_load).
set -euo pipefail
cd "$(dirname "$0")/.."
MODELKV_TEST_SCALE=full .venv/bin/python -m pytest -q -s -p no:cacheprovider --durations=0 \
    tests/sidecar/test_fuzz.py tests/sidecar/test_reliability.py tests/sidecar/test_hostile_clients.py \
    tests/sidecar/test_hostile_spool.py tests/sidecar/test_budget.py tests/sidecar/test_probes.py \
    tests/contract/test_hostile_spool.py
exec .venv/bin/python bench/attack.py "$@"
