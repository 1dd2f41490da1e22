"""`specdec check`: conformance of speculative decoding on the user's own model pair.

Each check is PASS/FAIL with a detail line:
- greedy: speculative output equals specdec's plain decoding bit for bit on built-in prompts
  (the target's forward is block-invariant, so no tolerance); a difference is a failure, shown
  with the target's top-1/top-2 gap there;
- transformers: specdec's plain decoding against transformers' own greedy generate() (what users
  compare with): share of prompts equal; each difference with its gap, explained when it falls
  on a near-tie of the target (other kernels round differently), a failure when not;
- sampling: at short fixed contexts, with a small top-k so cells are few, many generations
  through the real speculative path are compared with the exact target distribution of new
  tokens 1..4 (chi-square per position; positions 2..4 come from the first speculative round, so
  acceptance, residual and bonus draws are all exercised);
- invariants: cache lengths every round (engine assertions with check=True), nothing after EOS,
  max_new_tokens respected.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from scipy.stats import chisquare
from transformers import PreTrainedModel

from ..decode.engine import generate
from ..decode.proposal import Proposer
from ..decode.sampling import SamplingConfig, probs
from .ties import first_difference

GREEDY_PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in two sentences why the sky is blue.",
    "Traduis en anglais : « Le chat dort sur le canapé depuis ce matin. »",
    "Schreibe eine kurze E-Mail, um ein Treffen auf Donnerstag zu verschieben.",
    "List five prime numbers greater than 100.",
    "写一句关于秋天的短诗。",
)
SAMPLING_CONTEXTS = ("The capital of France is", "def add(a, b):\n   ")
SAMPLING_POSITIONS = 4
P_VALUE_THRESHOLD = 1e-3


@dataclass
class CheckResult:
    name: str
    passed: bool
    detail: str


@dataclass
class CheckPlan:
    # Fields with a help text are `specdec check` options too (cli.options.add_settings).
    greedy_prompts: int = field(default=4, metadata={"flag": "--prompts",
                                                     "help": "greedy prompts (built-in, several languages)"})
    greedy_tokens: int = field(default=32, metadata={"flag": "--tokens", "help": "new tokens per greedy prompt"})
    samples: int = field(default=100, metadata={"help": "sampled generations per context"})
    top_k: int = field(default=3, metadata={"flag": "--sample-top-k", "help": "top-k for the sampling check (few cells)"})
    temperature: float = 1.0


def estimate_seconds(target: PreTrainedModel, drafter: Proposer, plan: CheckPlan,
                     tokenize: Callable[[str], list[int]]) -> float:
    """Time one short speculative generation and scale it to the whole plan."""
    prompt = tokenize(SAMPLING_CONTEXTS[0])
    start = time.perf_counter()
    generate(target, prompt, drafter=drafter, max_new_tokens=SAMPLING_POSITIONS, eos_token_id=[])
    one = time.perf_counter() - start
    per_token = one / SAMPLING_POSITIONS
    greedy = plan.greedy_prompts * 2 * plan.greedy_tokens * per_token * 1.5
    sampling = len(SAMPLING_CONTEXTS) * plan.samples * one
    return greedy + sampling + 2 * plan.greedy_tokens * per_token


def check_greedy(target, drafter: Proposer, prompts: list[list[int]], new_tokens: int) -> CheckResult:
    lines, failures = [], 0
    for i, prompt in enumerate(prompts):
        plain = generate(target, prompt, max_new_tokens=new_tokens).new_tokens
        spec = generate(target, prompt, drafter=drafter, max_new_tokens=new_tokens, check=True)
        diff = first_difference(target, prompt, plain, spec.new_tokens)
        failures += diff is not None
        lines.append(f"prompt {i}: " + (f"identical ({len(plain)} tokens)" if diff is None else f"FAILURE, {diff.describe()}"))
    return CheckResult("greedy equals specdec's plain decoding, bit for bit", failures == 0, "; ".join(lines))


def check_transformers(target, prompts: list[list[int]], hf_outputs: list[list[int]], new_tokens: int) -> CheckResult:
    """specdec's plain decoding against transformers' greedy outputs (made before specdec first
    ran the target, on its unmodified layers)."""
    lines, equal, unexplained = [], 0, 0
    for i, (prompt, hf) in enumerate(zip(prompts, hf_outputs)):
        plain = generate(target, prompt, max_new_tokens=new_tokens).new_tokens
        diff = first_difference(target, prompt, hf, plain)
        equal += diff is None
        unexplained += diff is not None and not diff.near_tie
        lines.append(f"prompt {i}: " + ("identical" if diff is None else diff.describe()))
    head = f"{equal}/{len(prompts)} prompts equal"
    return CheckResult("specdec's plain decoding vs transformers' generate", unexplained == 0,
                       head + "; " + "; ".join(lines))


def exact_joint(model, prompt: list[int], cfg: SamplingConfig, positions: int) -> dict:
    """Exact P(x1..xn) of plain sampling from `model` (a transformers model, or a runtime: one
    prefill per prefix), over the tokens that have non-zero probability (a small top-k keeps
    this enumerable): {token tuple: probability}."""
    joint = {(): 1.0}
    for _ in range(positions):
        prefixes = [p for p, w in joint.items() if w > 0]
        rows = probs(_last_rows(model, [prompt + list(p) for p in prefixes]), cfg).cpu()
        joint = {
            p + (int(t),): joint[p] * float(row[t])
            for p, row in zip(prefixes, rows) for t in row.nonzero().flatten()
        }
    return joint


@torch.inference_mode()
def _last_rows(model, sequences: list[list[int]]) -> torch.Tensor:
    """The float32 next-token logits after each sequence (all of one length)."""
    if isinstance(model, PreTrainedModel):
        batch = torch.tensor(sequences, device=model.device)
        return model(input_ids=batch, logits_to_keep=1).logits[:, -1].float()
    return torch.cat([model.prefill(torch.tensor(s, device=model.device))[-1:] for s in sequences])


def chi2_pvalue(observed: dict, expected: dict, n: int) -> tuple[float, str]:
    """Chi-square of observed counts against expected probabilities (cells with an expected
    count under 5 merged); a count in a zero-probability cell fails outright."""
    impossible = set(observed) - set(expected)
    if impossible:
        return 0.0, f"zero-probability outcome generated: {sorted(impossible)[:3]}"
    cells = sorted(expected)
    exp = np.array([expected[c] * n for c in cells])
    obs = np.array([observed.get(c, 0) for c in cells], dtype=float)
    big = exp >= 5
    exp = np.append(exp[big], exp[~big].sum())
    obs = np.append(obs[big], obs[~big].sum())
    keep = exp > 0
    if keep.sum() < 2:
        return 1.0, "one outcome only"
    exp = exp[keep] * obs[keep].sum() / exp[keep].sum()
    return float(chisquare(obs[keep], exp).pvalue), f"{int(keep.sum())} cells"


def marginal(joint: dict, positions: tuple[int, ...]) -> dict:
    """Distribution of the tokens at `positions` (0-based) under a joint {sequence: weight}."""
    out: dict = {}
    for seq, w in joint.items():
        key = tuple(seq[i] for i in positions)
        out[key] = out.get(key, 0.0) + w
    return out


def sampling_pvalues(samples: list[tuple[int, ...]], joint: dict) -> dict[str, tuple[float, str]]:
    """Chi-square p-value per position, and for the pair of positions 2 and 3 jointly."""
    tests = {f"position {i + 1}": (i,) for i in range(len(next(iter(joint))))}
    tests["positions 2+3"] = (1, 2)
    return {
        name: chi2_pvalue(Counter(tuple(s[i] for i in pos) for s in samples), marginal(joint, pos), len(samples))
        for name, pos in tests.items()
    }


def check_sampling(target, drafter: Proposer, contexts: list[list[int]], plan: CheckPlan,
                   progress: Callable[[], None] = lambda: None) -> CheckResult:
    cfg = SamplingConfig(plan.temperature, top_k=plan.top_k)
    lines, worst = [], 1.0
    for c, prompt in enumerate(contexts):
        exact = exact_joint(target, prompt, cfg, SAMPLING_POSITIONS)
        seen = []
        for seed in range(plan.samples):
            out = generate(target, prompt, drafter=drafter, max_new_tokens=SAMPLING_POSITIONS,
                           temperature=cfg.temperature, top_k=cfg.top_k, seed=seed, eos_token_id=[])
            seen.append(tuple(out.new_tokens))
            progress()
        for name, (p, note) in sampling_pvalues(seen, exact).items():
            worst = min(worst, p)
            lines.append(f"context {c} {name}: p={p:.3g} ({note})")
    passed = worst > P_VALUE_THRESHOLD
    head = f"{plan.samples} samples/context, top_k={plan.top_k}, threshold p > {P_VALUE_THRESHOLD:g}"
    return CheckResult("sampling matches the target distribution", passed, head + "; " + "; ".join(lines))


def check_invariants(target, drafter: Proposer, prompt: list[int], new_tokens: int) -> CheckResult:
    plain = generate(target, prompt, max_new_tokens=new_tokens, eos_token_id=[]).new_tokens
    problems = []
    for limit in (1, 2, new_tokens // 2 + 1):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=limit, eos_token_id=[], check=True)
        if out.new_tokens != plain[:limit] or len(out.new_tokens) > limit:
            problems.append(f"max_new_tokens={limit}: got {len(out.new_tokens)} tokens")
    eos = plain[len(plain) // 2]
    out = generate(target, prompt, drafter=drafter, max_new_tokens=new_tokens, eos_token_id=eos, check=True)
    expected = plain[: plain.index(eos) + 1]
    if out.new_tokens != expected or out.finish_reason != "eos":
        problems.append(f"EOS {eos}: {len(out.new_tokens)} tokens committed, expected {len(expected)}")
    detail = "cache lengths asserted every round; max_new_tokens and EOS respected" if not problems else "; ".join(problems)
    return CheckResult("invariants (caches, EOS, max_new_tokens)", not problems, detail)


def run_checks(checks: list[tuple[str, Callable[[], CheckResult]]]) -> list[CheckResult]:
    """Run each check; an engine assertion (a cache out of step) is that check's failure."""
    results = []
    for name, run in checks:
        try:
            results.append(run())
        except AssertionError as e:
            results.append(CheckResult(name, False, f"invariant violated: {e}"))
    return results


def to_json(results: list[CheckResult], seconds: float) -> dict:
    return {"passed": all(r.passed for r in results), "seconds": seconds,
            "checks": [asdict(r) for r in results]}
