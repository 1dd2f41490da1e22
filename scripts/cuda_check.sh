#!/usr/bin/env bash
# The checks that need a GPU, in one short run (at most ~8 minutes), for a session that is lent
# one (the `device` tool): is specdec's forward block-invariant there, does a round read the
# device once, and what does speculation do on the registry models' shapes. Writes everything
# it prints to $OUT/cuda_check.txt (the device tool's output folder), or to docs/cuda/ here.
#
#   bash scripts/cuda_check.sh            # on the GPU machine, from the repository root
#
# Real weights do not travel to that machine (only the working tree does), so the model-level
# run uses models of the registry shapes with random weights (specdec.models.load.random_model): a
# forward's arithmetic, and so its block invariance, does not depend on the values; acceptance
# does, so only equality and costs are read from it.
#
# The device image has torch and transformers but not gguf, which specdec imports: carry its wheel
# (`pip download --no-deps gguf==<version> -d .whl`, `.whl` in the run's carry) and install it into
# /tmp/site first, as docs/cuda.md shows; /tmp/site is on the path below whether it exists or not.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-docs/cuda}
mkdir -p "$out"
log="$out/cuda_check.txt"  # .txt: docs/ keeps no .log files (tests/test_docs.py)
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
{
  echo "# specdec cuda_check, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__)"

  echo "## 1. block invariance on cuda (tests/test_invariance.py) and one host read per round (tests/test_host_sync.py)"
  SPECDEC_TEST_DEVICE=cuda timeout 300 $PY -m pytest -q -p no:cacheprovider -x \
    tests/test_invariance.py tests/test_host_sync.py 2>&1 | tail -25

  echo "## 2. linear kernels: what each layer shape's probe found (min_rows: 1 none, 2 pad one row, 17 fixed block)"
  timeout 120 $PY - <<'PY'
import torch
from specdec.runtime.hf.linear import PackedLinear
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for k, n in [(1536, 1536), (1536, 256), (1536, 8960), (8960, 1536), (1536, 151936)]:
        layer = PackedLinear(torch.nn.Linear(k, n, bias=False, device="cuda", dtype=dtype))
        print(f"{dtype} {k}x{n}: min_rows={layer.min_rows}")
PY

  echo "## 3. greedy equality and cost on the registry shapes, random weights, bf16, 64 tokens"
  timeout 240 $PY - <<'PY'
import time, torch
from specdec import DraftModel, PromptLookup, generate
from specdec.runtime.hf.causal_lm import CausalLM
from specdec.models.load import random_model
torch.manual_seed(0)
target = random_model("qwen2.5-coder-1.5b-instruct", "bfloat16", "cuda")
draft = random_model("qwen2.5-coder-0.5b-instruct", "bfloat16", "cuda")
gen = torch.Generator().manual_seed(0)
for i in range(4):
    base = torch.randint(0, 150000, (40,), generator=gen)
    prompt = torch.cat([base, base[:20]]).cuda()  # repeats, so lookup proposes
    times, outs = {}, {}
    for name, make in {"plain": lambda: None, "draft k=2": lambda: DraftModel(draft, 2),
                       "draft k=4": lambda: DraftModel(draft, 4), "lookup k=3": lambda: PromptLookup(3)}.items():
        generate(target, prompt, drafter=make(), max_new_tokens=8, eos_token_id=[])  # warm-up
        torch.cuda.synchronize(); t = time.perf_counter()
        out = generate(target, prompt, drafter=make(), max_new_tokens=64, eos_token_id=[])
        torch.cuda.synchronize()
        times[name], outs[name] = time.perf_counter() - t, out.new_tokens
    print(f"prompt {i}: " + " | ".join(
        f"{n} {'EQUAL' if outs[n] == outs['plain'] else 'DIFF'} {64 / t:.1f} tok/s" for n, t in times.items()))
lm = CausalLM(target)
lm.prefill(torch.randint(0, 150000, (512,)).cuda())
for rows in (1, 2, 3, 5, 9, 17):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20):
        lm.forward(torch.randint(0, 150000, (rows,)).cuda()); lm.cache.trim(512)
    torch.cuda.synchronize()
    print(f"target forward of {rows} rows at context 512: {(time.perf_counter() - t) / 20 * 1000:.2f} ms")
PY
} 2>&1 | tee "$log"
