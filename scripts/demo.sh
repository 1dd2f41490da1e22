#!/usr/bin/env bash
# Set-up plus the main job: speculative generation on the default Qwen2.5-Coder pair.
# The first run reads the two GGUF files once into the model cache (about a minute), later runs start in seconds.
# llama.cpp is not built here (generate never runs it); bash scripts/setup.sh builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-llamacpp
.venv/bin/specdec generate --max-new-tokens 96 \
  --prompt "Write a Python function that returns the n-th Fibonacci number, with a docstring."
