#!/usr/bin/env bash
# Issue 34's specdec side: `specdec serve` plain (--proposer ar) and speculative (--proposer auto,
# the cost model's k per request and round) at 1/2/4/8 clients with continuous batching
# (--max-sequences 8), the default GGUF pair, 128 greedy tokens, HumanEval/0-7 as chat through the
# official openai client, as scripts/measure/llama_server_concurrency.sh measures llama-server.
# One flock'd bench per level into $OUT/humaneval/bench-cN (the servers' logs beside it).
#
#   bash scripts/measure/specdec_serve_concurrency.sh
#   LEVELS="2 4" bash scripts/measure/specdec_serve_concurrency.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-docs/serving/specdec-concurrency-amx}
LEVELS=${LEVELS:-"1 2 4 8"}
mkdir -p "$OUT/humaneval"
for n in $LEVELS; do
  dir="$OUT/humaneval/bench-c$n"
  if [ -e "$dir" ]; then echo "[skip] $dir exists" >&2; continue; fi
  flock /tmp/cpu.lock .venv/bin/specdec bench --dataset humaneval --limit 8 --max-new-tokens 128 \
    --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --concurrency "$n" \
    --serve specdec-plain="--proposer ar" --serve specdec-spec="--proposer auto" --serve-api chat \
    --baseline specdec-plain --client openai --no-progress --out "$dir"
done
