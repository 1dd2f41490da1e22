#!/usr/bin/env bash
# Issues 33/34: servers side by side at 1/2/4/8 clients, each level one paired `specdec bench` over
# every server (scripts/serving_bench.py), the servers started afresh per level: llama-server
# (scripts/setup_llama_server.sh's build) plain and speculative (the 0.5B draft, 3 tokens a round,
# `-np N` = N slots, 2 threads) and `specdec serve` plain (--proposer ar) and speculative (--proposer
# auto, continuous batching with the cost model's k per sequence); the default Q4_K_M GGUF pair,
# 128 greedy tokens, prompts sent as chat (/v1/chat/completions, each server's own template) through
# the official openai client. Into $OUT/$SET/bench-cN, the servers' logs beside them
# (server-NAME-npN.log) and the machine's load every 10 s while it ran (load-cN.log: whoever else
# ran, and how hard).
#
#   bash scripts/measure/serving_concurrency.sh                       # HumanEval/0-7
#   SET=spec-bench bash scripts/measure/serving_concurrency.sh        # 8 Spec-Bench first turns
#   LEVELS="4 8" QUIET=1 bash scripts/measure/serving_concurrency.sh  # some levels; wait for idle CPUs
#   ENGINES="--engine llamacpp" OUT=... bash scripts/measure/serving_concurrency.sh  # llama-server alone
#   ENGINES="--engine vllm" LEVELS="1 2 4" OUT=... bash scripts/measure/serving_concurrency.sh
#
# vLLM (scripts/setup_vllm.sh first): its CPU server plain and with the 0.5B draft (VLLM_SPEC, its
# speculative_config: draft_model, 3 tokens a round, as llama-server's), bf16 converted folders
# (vLLM's CPU build reads no GGUF), the same 2 threads.
#
# QUIET=1: inside the lock, wait (up to 20 min) until the CPUs are below 10% busy for two 5-s
# samples before each level: tests that others run without the lock slow llama.cpp's spinning
# threads several-fold. A level whose folder exists is skipped (remove it to measure it again).
set -euo pipefail
cd "$(dirname "$0")/../.."
SET=${SET:-humaneval}
OUT=${OUT:?set OUT, e.g. OUT=docs/serving/concurrency-zen4}
export ENGINES=${ENGINES:-"--engine llamacpp --engine specdec"}
LEVELS=${LEVELS:-"1 2 4 8"}
export VLLM_SPEC=${VLLM_SPEC:-'{"method": "draft_model", "model": "qwen2.5-coder-0.5b-instruct", "num_speculative_tokens": 3}'}
case "$SET" in
  humaneval) SELECT=(--dataset humaneval --limit 8) ;;
  spec-bench) SELECT=(--dataset spec-bench --per-category 1
                      --categories writing,roleplay,reasoning,math,coding,extraction,stem,humanities) ;;
  *) echo "SET is humaneval or spec-bench" >&2; exit 2 ;;
esac
mkdir -p "$OUT/$SET"

busy() {  # percent of CPU time not idle over 5 s
  read -r _ a b c d e f g h _ < /proc/stat; local t1=$((a+b+c+d+e+f+g+h)) i1=$((d+e)); sleep 5
  read -r _ a b c d e f g h _ < /proc/stat; local t2=$((a+b+c+d+e+f+g+h)) i2=$((d+e))
  echo $(( 100 * ((t2 - t1) - (i2 - i1)) / (t2 - t1) ))
}
wait_quiet() {
  local start=$SECONDS ok=0 b=0
  while (( SECONDS - start < 1200 && ok < 2 )); do
    b=$(busy); if (( b < 10 )); then ok=$((ok + 1)); else ok=0; fi
  done
  echo "[quiet] waited $((SECONDS - start)) s, last sample ${b}% busy" >&2
}
export -f busy wait_quiet

for n in $LEVELS; do
  if [ -e "$OUT/$SET/bench-c$n" ]; then echo "[skip] $OUT/$SET/bench-c$n exists" >&2; continue; fi
  flock /tmp/cpu.lock bash -c '
    set -euo pipefail
    n=$1; dir=$2; shift 2
    [ "${QUIET:-0}" = 1 ] && wait_quiet
    (while sleep 10; do echo "$(date +%T) load $(cut -d" " -f1-3 /proc/loadavg) | $(ps -eo pcpu,args --sort=-pcpu | sed -n 2,4p | cut -c1-70 | tr "\n" "|")"; done) > "$dir/load-c$n.log" &
    watcher=$!
    trap "kill $watcher" EXIT
    .venv/bin/python scripts/serving_bench.py $ENGINES --model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct \
      --spec-args "--spec-draft-n-max 3 --spec-draft-n-min 0 --spec-draft-p-min 0" --spec-config "$VLLM_SPEC" --threads 2 \
      --concurrency "$n" --api chat --out "$dir" \
      -- "$@" --max-new-tokens 128 --target qwen2.5-coder-1.5b-instruct --client openai --no-progress
  ' _ "$n" "$OUT/$SET" "${SELECT[@]}"
done
