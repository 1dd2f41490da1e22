#!/usr/bin/env bash
# Issue 14's measurement (docs/quant.md): specdec's int4 target against llama.cpp on the same GGUF.
#
#   1. specdec bench, paired and interleaved per prompt, greedy, 2 threads: the int4 target's plain
#      decoding (ar), with a draft at k=2 and k=4, with prompt lookup, and llama.cpp's plain
#      decoding of the target's GGUF (llamacpp) and its prompt lookup (llamacpp-lookup), on
#      HumanEval/0..LIMIT-1 (and Spec-Bench, PER_CATEGORY prompts per category, if DATASETS names it)
#      with MAX_NEW new tokens; speedups are paired over `ar`.
#   2. specdec perplexity: llama.cpp, the dequantized target, int8 and int4 on the same windows.
#
# Usage (heavy: run it alone; on the shared machine wrap it in flock):
#   flock /tmp/cpu.lock bash scripts/measure/quant_bench.sh
#   LIMIT=2 MAX_NEW=32 PPL_TOKENS=1024 DATASETS=humaneval OUT=runs/quant-smoke flock /tmp/cpu.lock bash scripts/measure/quant_bench.sh
# Environment: LIMIT (10), MAX_NEW (128), DRAFT_QUANT (int8: the draft's quant=, see docs/quant.md),
# THREADS (2), PPL_TOKENS (4096; 0 skips the perplexity), PPL_ENGINES (llamacpp,none,int8,int4),
# DTYPE (auto), DATASETS ("humaneval"; "humaneval spec-bench" for both), PER_CATEGORY (4), METHODS,
# OUT (runs/quant-MAX_NEW; a folder per dataset), PY (.venv/bin/python). llama.cpp is whichever
# llama_cpp Python imports: PYTHONPATH=DIR runs a native build installed with pip --target DIR
# (the config's environment.llama_cpp.cpu_features says which ran; docs/quant.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PY:-.venv/bin/python}
LIMIT=${LIMIT:-10}
MAX_NEW=${MAX_NEW:-128}
DRAFT_QUANT=${DRAFT_QUANT:-int8}
THREADS=${THREADS:-2}
PPL_TOKENS=${PPL_TOKENS:-4096}
PPL_ENGINES=${PPL_ENGINES:-llamacpp,none,int8,int4}
DTYPE=${DTYPE:-auto}
OUT=${OUT:-runs/quant-$MAX_NEW}
DATASETS=${DATASETS:-humaneval}
PER_CATEGORY=${PER_CATEGORY:-4}
METHODS=${METHODS:-ar,draft:k=2,draft:k=4,lookup:k=2,llamacpp,llamacpp-lookup:k=4:ngram=3}
export OMP_NUM_THREADS=$THREADS  # torch's threads; llama.cpp takes torch's count

set -x
for dataset in $DATASETS; do
    if [ "$dataset" = humaneval ]; then select=(--limit "$LIMIT"); else select=(--per-category "$PER_CATEGORY"); fi
    "$PY" -m specdec.cli bench --dataset "$dataset" "${select[@]}" --max-new-tokens "$MAX_NEW" --dtype "$DTYPE" \
        --target-quant int4 --draft-quant "$DRAFT_QUANT" --methods "$METHODS" --out "$OUT/$dataset" --resume
done
if [ "$PPL_TOKENS" -gt 0 ]; then
    "$PY" -m specdec.cli perplexity --engines "$PPL_ENGINES" --tokens "$PPL_TOKENS" --window 2048 --stride 1024 \
        --dtype "$DTYPE" --threads "$THREADS" > "$OUT/perplexity.jsonl.tmp"
    mv "$OUT/perplexity.jsonl.tmp" "$OUT/perplexity.jsonl"
fi
