#!/usr/bin/env bash
# Issue 12's "no speed lost to invariance": the same HumanEval/0-19 bench (128 new tokens, plain
# decoding, the int8 draft at k=2 and transformers' generate) on this checkout and on the code
# before specdec's own forward (commit b2643aa: transformers' layers, F.linear, batched
# attention), one after the other per dtype. transformers' own generate (hf-ar) runs in both,
# untouched by either, so it measures how the machine drifted between the two runs;
# docs/forward.md pairs the rows by prompt.
#
#   flock /tmp/cpu.lock bash scripts/forward_before_after.sh     # about 1.5 hours on 2 cores
#   DTYPES=float32 LIMIT=10 bash scripts/forward_before_after.sh  # HumanEval/0-9, one dtype
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$PWD/.venv/bin/python}
BEFORE=${BEFORE:-b2643aa}
tree=/tmp/specdec-before-$BEFORE
[ -d "$tree" ] || git worktree add "$tree" "$BEFORE"
for dtype in ${DTYPES:-bfloat16 float32}; do
  "$PY" -m specdec.cli bench --dataset humaneval --limit "${LIMIT:-20}" --max-new-tokens 128 \
      --dtype "$dtype" --methods ar,draft:k=2:quant=int8,hf-ar --out "docs/bench/forward-after-$dtype-humaneval-${LIMIT:-20}" --resume
  # the method names of that commit: draft-int8:k=2 is today's draft:k=2:quant=int8
  PYTHONPATH="$tree/src" "$PY" -m specdec.cli bench --dataset humaneval --limit "${LIMIT:-20}" --max-new-tokens 128 \
      --dtype "$dtype" --methods ar,draft-int8:k=2,hf-ar --out "docs/bench/forward-before-$dtype-humaneval-${LIMIT:-20}" --resume
done
