#!/usr/bin/env bash
# Installs what the tests need (scripts/setup.sh) and runs the test suite.
# Tests marked `real` load the real model weights (converted once, then cached).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Two workers, one file each at a time (a module's fixtures load once; the files that load the
# 1.5B pair are one file, so two copies never meet in memory). SPECDEC_TEST_WORKERS=0: one process.
.venv/bin/python -m pytest -q -n "${SPECDEC_TEST_WORKERS:-2}" --dist loadfile "$@"
