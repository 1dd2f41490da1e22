#!/usr/bin/env bash
# Installs what the tests need (scripts/setup.sh) and runs the test suite.
# Tests marked `real` load the real model weights (converted once, then cached).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q "$@"
