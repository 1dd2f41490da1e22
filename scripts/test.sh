#!/usr/bin/env bash
# Installs what the tests need (scripts/setup.sh) and runs the test suite.
# Tests marked `real` load the real model weights (converted once, then cached).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# First the tiny-model tests on two workers, then the tests marked `real` in one process with
# nothing beside it: one of their files peaks at 15.3 GB (the 1.5B pair in float32 and bfloat16),
# another at 9.8 GB (the pair on the native runtime), and beside the other worker's tests they
# overran 24 GB: the kernel killed a worker and pytest-xdist, replacing it, hung until CI's limit.
# A worker that dies ends the run with an error instead (--max-worker-restart=0).
# Extra arguments go to both runs; SPECDEC_TEST_WORKERS=0: the first run in one process too.
run() {
  local rc=0
  .venv/bin/python -m pytest -q "$@" || rc=$?
  [ "$rc" -eq 5 ] && return 0  # nothing of this kind among the tests asked for
  return "$rc"
}
status=0
run -n "${SPECDEC_TEST_WORKERS:-2}" --max-worker-restart=0 -m "not real and not slow and not vllm" "$@" || status=1
run -m "real and not slow and not vllm" "$@" || status=1
exit "$status"
