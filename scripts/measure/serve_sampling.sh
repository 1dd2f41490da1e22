#!/usr/bin/env bash
# Issue 33's one-client goals on the machine at hand: through `specdec serve`, (a) greedy decode
# tokens/s within 5% of the same method in process, and (b) sampling (temperature 0.8, top-p 0.95,
# then with min-p 0.05) within 10% of greedy, plain and speculative, in process and served.
#
# Two servers are started once and kept for every run (so each run pairs the same processes):
# `specdec serve --proposer ar` (plain) and `--proposer auto` (the default). Each run is one
# `specdec bench` over the same prompts: in process `ar` and the method the server's `auto` runs
# ($METHOD, the CPU kind's default before advice unless given), and the two servers through the
# official openai client on /v1/completions (the same prompt ids as in process), 128 tokens,
# seed 1 (+ repeat). Runs go greedy, top-p, top-p + min-p, greedy again (the second greedy run
# brackets any drift of the machine), per prompt set; sampled runs are paired with the greedy
# ones per prompt by scripts/measure/serve_sampling_table.py.
#
#   OUT=docs/serving/sampling-zen4 bash scripts/measure/serve_sampling.sh
#   RUNS="greedy greedy-again" SETS=humaneval OUT=... bash scripts/measure/serve_sampling.sh  # some runs
#
# A run whose folder exists is skipped (bench --resume finishes one cut short).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT, e.g. OUT=docs/serving/sampling-zen4}
METHOD=${METHOD:-$(.venv/bin/python -c "from specdec.tune.saved import DEFAULT_CHOICE, device_kind; print(DEFAULT_CHOICE[device_kind(\"cpu\")])")}  # what auto runs before advice
SETS=${SETS:-"humaneval spec-bench"}
RUNS=${RUNS:-"greedy top-p min-p greedy-again"}
mkdir -p "$OUT"
exec 9>/tmp/cpu.lock
flock 9

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait' EXIT
serve() {  # NAME PORT PROPOSER
  .venv/bin/specdec serve --port "$2" --proposer "$3" --log-level warning >"$OUT/server-$1.log" 2>&1 &
  pids+=($!)
}
serve plain 18801 ar
serve spec 18802 auto
for port in 18801 18802; do
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "server on $port did not start: see $OUT/server-*.log" >&2; exit 1; }
done

run() {  # SET NAME SAMPLING...
  local set=$1 name=$2; shift 2
  local dir="$OUT/$set/$name"
  [ -e "$dir/summary.json" ] && { echo "[skip] $dir" >&2; return; }
  case "$set" in
    humaneval) select=(--dataset humaneval --limit 8) ;;
    spec-bench) select=(--dataset spec-bench --per-category 1
                        --categories writing,roleplay,reasoning,math,coding,extraction,stem,humanities) ;;
  esac
  resume=(); [ -e "$dir" ] && resume=(--resume)
  echo "[run] $dir $*" >&2
  .venv/bin/specdec bench "${select[@]}" --max-new-tokens 128 --target-quant int4 --methods "ar,$METHOD" \
    --endpoint plain=http://127.0.0.1:18801/v1/completions --endpoint spec=http://127.0.0.1:18802/v1/completions \
    --baseline plain --client openai --seed 1 --no-progress --out "$dir" "${resume[@]}" "$@"
}
declare -A SAMPLING=([greedy]="" [top-p]="--temperature 0.8 --top-p 0.95"
                     [min-p]="--temperature 0.8 --top-p 0.95 --min-p 0.05" [greedy-again]="")
for set in $SETS; do
  for name in $RUNS; do
    # shellcheck disable=SC2086 # the sampling flags split into words
    run "$set" "$name" ${SAMPLING[$name]}
  done
done
