#!/usr/bin/env bash
# Installs vLLM's CPU build (scripts/setup_vllm.sh: its own venv, about 3.4 GB, once) and runs the
# tests that start real vLLM servers (tests/test_vllm.py, marked `vllm`), with specdec's venv
# (scripts/setup.sh) as the client. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
bash scripts/setup_vllm.sh
# One process: the servers a module starts must not meet another module's in memory.
.venv/bin/python -m pytest -q -m vllm tests/test_vllm.py "$@"
