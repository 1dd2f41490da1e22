#!/usr/bin/env bash
# Issue 12's goal runs (docs/forward.md): greedy speculative output equals specdec's plain decoding
# bit for bit on HumanEval/0-19 and Spec-Bench 4 per category (52 prompts), 128 new tokens, in
# each dtype, for the default proposer with no advice saved (the int8 draft, k=2), the draft at
# k=4, prompt lookup and the tree; transformers' plain generate() beside them on HumanEval in
# bf16 (in float32 its unmodified copy of the target does not fit beside these methods in 24 GiB:
# the float32 pairing with transformers was a one-off script: git show 85dd685:scripts/forward_before_after.sh).
#
#   flock /tmp/cpu.lock bash scripts/measure/forward_goal.sh          # about 2 hours on 2 cores (AVX-512 BF16)
#   DTYPES=float32 DATASETS=humaneval bash scripts/measure/forward_goal.sh
#
# Every run resumes where it stopped (--resume); folders: docs/bench/forward-DTYPE-DATASET.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
SPEC="draft:k=2:quant=int8,draft:k=4,lookup:k=3,draft:k=2:width=2"
for dtype in ${DTYPES:-bfloat16 float32}; do
  for dataset in ${DATASETS:-humaneval spec-bench}; do
    if [ "$dataset" = humaneval ]; then
      select=(--limit 20); methods="ar,$SPEC$([ "$dtype" = float32 ] || echo ,hf-ar)"
    else
      select=(--per-category 4); methods="ar,$SPEC"
    fi
    "$PY" -m specdec.cli bench --dataset "$dataset" "${select[@]}" --max-new-tokens 128 --dtype "$dtype" \
        --methods "$methods" --out "docs/bench/forward-$dtype-$dataset" --resume
  done
done
