#!/usr/bin/env bash
# Runs `specdec generate --json` on three prompts (code, chat, translation) with each proposer
# and prints one line per run: tokens identical to --proposer none?, decode tok/s, mean
# accepted length. The first docs/generate.md (`git show f08191e:docs/generate.md`) quoted its output.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-96}
declare -A PROMPTS=(
  [code]="Write a Python function that merges two sorted lists into one sorted list."
  [chat]="What are three good habits for staying focused while working from home?"
  [translation]="Translate to German: The weather is nice today, so we are going to the lake and will have a picnic there."
)
out=$(mktemp -d)
for task in code chat translation; do
  for proposer in none draft lookup; do
    .venv/bin/specdec generate --json --proposer "$proposer" --max-new-tokens "$N" \
      --prompt "${PROMPTS[$task]}" 2>/dev/null > "$out/$task-$proposer.json"
  done
  .venv/bin/python - "$out" "$task" <<'PY'
import json, sys
out, task = sys.argv[1:]
runs = {p: json.load(open(f"{out}/{task}-{p}.json")) for p in ("none", "draft", "lookup")}
base = runs["none"]
for p, r in runs.items():
    s = r["stats"]
    print(f"{task:12s} {p:7s} identical={r['new_tokens'] == base['new_tokens']!s:5s} "
          f"tokens={len(r['new_tokens']):3d} decode={s['tokens_per_s']:.2f} tok/s "
          f"speedup={s['tokens_per_s'] / base['stats']['tokens_per_s']:.2f}x "
          f"mean_accepted_length={s['mean_accepted_length']:.2f} acceptance={s['acceptance_rate']:.2f}")
PY
done
rm -rf "$out"
