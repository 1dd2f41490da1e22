#!/usr/bin/env bash
# Issue 23's speed goal (docs/runtime.md): the fastest lossless methods on the native runtime
# against llama.cpp's plain decoding of the same GGUF, paired per prompt in one bench run per set:
# HumanEval/0-19 and Spec-Bench 4 per category (52 prompts), 128 greedy tokens; specdec's plain
# decoding of the int4 target beside them (every speculative output must equal it).
#
#   flock /tmp/cpu.lock bash scripts/measure/runtime_goal.sh     # about 35 minutes on 2 cores (Xeon, AVX-512)
#   METHODS=ar,auto,llamacpp DATASETS=humaneval OUT=runs/x bash scripts/measure/runtime_goal.sh
#
# A llama.cpp built for this CPU (docs/llamacpp.md) is taken when PYTHONPATH names it. Each run
# resumes where it stopped (--resume); folders: $OUT-DATASET (default runs/runtime-goal-DATASET).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/runtime-goal}
METHODS=${METHODS:-ar,auto,draft:k=3:quant=int4:vocab=32768,llamacpp}
for dataset in ${DATASETS:-humaneval spec-bench}; do
  if [ "$dataset" = humaneval ]; then select=(--limit 20); else select=(--per-category 4); fi
  .venv/bin/specdec bench --dataset "$dataset" "${select[@]}" --max-new-tokens 128 --target-quant auto \
    --methods "$METHODS" --out "$OUT-$dataset" --resume "$@"
done
