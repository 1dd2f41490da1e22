#!/usr/bin/env bash
# Paired A/B of the native decoder's kernels (issue 52): runtime_bench.py --parts prefill rows with
# this checkout's kernels ("new") and with those of git revision REV ("old": its decoder.cpp and
# qgemm.cpp, built beside them), alternating, the order swapped every round; each run under the CPU
# lock, each run's JSON kept in OUT; then the medians of each side (prefill tokens/s of the target
# and the int3 draft over every timed prefill, ms per forward of 1..32 rows over the runs).
#
#   bash scripts/measure/prefill_ab.sh REV   # e.g. REV=HEAD~3; ROUNDS=3 OUT=/tmp/prefill_ab PARTS="prefill rows"
set -euo pipefail
cd "$(dirname "$0")/../.."
REV=${1:?usage: prefill_ab.sh REV (the git revision whose kernels are the "old" side)}
ROUNDS=${ROUNDS:-3}
PARTS=${PARTS:-prefill rows}
OUT=${OUT:-/tmp/prefill_ab}
OLD="$OUT/kernels-$(git rev-parse --short "$REV")"
mkdir -p "$OLD"
for name in decoder.cpp qgemm.cpp; do
  git show "$REV:src/specdec/kernels/$name" >"$OLD/$name"
done
run() {  # side, round
  local extra=()
  [ "$1" = old ] && extra=(--kernels "$OLD")
  # shellcheck disable=SC2086  # PARTS is a list of parts
  flock /tmp/cpu.lock env PYTHONPATH=src .venv/bin/python scripts/measure/runtime_bench.py \
    --parts $PARTS --sizes 1,2,4,8,16,32 --out "$OUT/$1-$2.json" "${extra[@]}" >/dev/null
}
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then run new "$round"; run old "$round"; else run old "$round"; run new "$round"; fi
  echo "round $round of $ROUNDS done" >&2
done
.venv/bin/python - "$OUT" <<'EOF'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
summary = {}
for side in ("old", "new"):
    runs = [json.loads(p.read_text()) for p in sorted(out.glob(f"{side}-*.json"))]
    entry = {"runs": len(runs), "cpu": runs[0]["cpu"]["model"]}
    for model in ("target", "draft_int3_32768"):
        if f"prefill_{model}" in runs[0]:
            prefills = [r[f"prefill_{model}"] for r in runs]
            seconds = [s for p in prefills for s in p["seconds"]]
            entry[f"prefill_{model}_tok_s"] = round(prefills[0]["tokens"] / statistics.median(seconds), 1)
            entry[f"prefill_{model}_stages_ms"] = {
                k: round(statistics.median(p["stages_ms"][k] for p in prefills), 1) for k in prefills[0]["stages_ms"]}
        for kind in ("block", "lanes") if f"rows_{model}" in runs[0] else ():
            sizes = runs[0][f"rows_{model}"]
            entry[f"{kind}_{model}_ms"] = {
                key.split()[1]: round(statistics.median(r[f"rows_{model}"][key]["wall"] for r in runs), 2)
                for key in sizes if key.startswith(kind)}
    summary[side] = entry
print(json.dumps(summary, indent=1))
(out / "summary.json").write_text(json.dumps(summary, indent=1))
EOF
