#!/usr/bin/env bash
# The reliability tests at full size (docs/reliability.md): spools holding 10 000 hostile
# documents, 1 000 writers killed mid-write under continuous scrapes, 60 s of 16 concurrent
# scrapers while writers beat every second. The tests print their figures (-s).
set -euo pipefail
cd "$(dirname "$0")/.."
MODELKV_TEST_SCALE=full exec .venv/bin/python -m pytest -q -s -p no:cacheprovider --durations=0 \
    tests/test_fuzz.py tests/test_reliability.py "$@"
