#!/usr/bin/env bash
# Installs what the tests need (scripts/setup.sh) and runs the test suite.
# Tests marked `real` load the real model weights (converted once, then cached).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Two workers: the tests marked `real` in one of them, one after another (tests/conftest.py puts
# them in one xdist group: two of their files at once need more than 24 GB), the tiny-model tests
# spread over both. A worker that dies (the kernel's OOM killer) ends the run with an error
# instead of being replaced: a replaced worker has left pytest-xdist waiting forever.
# SPECDEC_TEST_WORKERS=0: one process.
.venv/bin/python -m pytest -q -n "${SPECDEC_TEST_WORKERS:-2}" --dist loadgroup --max-worker-restart=0 "$@"
