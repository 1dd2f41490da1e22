"""The flags every command that loads models shares: the target, the draft and how to load them,
--proposer and the flags that fold into its spec (cli.args turns them into methods and a
specdec.load.LoadSpec), and the sampling settings."""

from __future__ import annotations

import argparse

from ..load.spec import DTYPE_NAMES
from ..methods.kinds import KINDS
from ..quant import DRAFT_MODES
from ..runtime.choose import RUNTIMES


def add_model_args(p: argparse.ArgumentParser, draft_help: str = "draft model of draft and hybrid methods",
                   target_quant: str = "auto") -> None:
    """The target, the draft and how to load them; `target_quant` is --target-quant's default
    (bench, sweep and perplexity compare forms and keep none, the dense copy)."""
    from ..registry import DEFAULT_DRAFT, DEFAULT_TARGET
    from ..models.target_form import TARGET_FORMS

    p.add_argument("--target", default=DEFAULT_TARGET,
                   help="registry name, GGUF file (llama, qwen2, qwen3; or a folder holding one) or local HF model "
                        "folder")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"{draft_help}: as --target (a GGUF's tokenizer must be "
                                                          "the target's)")
    p.add_argument("--target-quant", default=target_quant, choices=TARGET_FORMS,
                   help="the target's linear layers as 8-bit or 4-bit codes on specdec's int8-activation kernels "
                        "(CPU): a GGUF (or registry model) as it is, every Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K "
                        "block kept exactly (int4; int8 rounds its 4- and 5-bit blocks to 8); a folder rounded. "
                        "Lossless speculation is then relative to the quantized target. auto: the fastest form of "
                        "the model as shipped, int4 for a GGUF on a CPU where specdec's kernels run, dense elsewhere "
                        f"(default: {target_quant})")
    p.add_argument("--draft-quant", default=None, choices=DRAFT_MODES,
                   help="quant= for every draft method: the draft's linear layers as 8-, 4- or 3-bit codes "
                        "(CPU; int3 on the native runtime), a cheaper draft, still lossless")
    p.add_argument("--draft-int8", action="store_true", help="the same as --draft-quant int8")
    p.add_argument("--quant-group", type=int, default=32, metavar="G",
                   help="int4 group size (inputs per scale) when a Hugging Face folder is rounded to int4 "
                        "(32, 64, 128 or 256); a registry model's GGUF blocks are groups of 32")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="vocab=N for every draft method: the draft scores only the N most frequent token ids "
                        "(e.g. 32768), a cheaper draft step, still lossless")
    p.add_argument("--dtype", default="auto", choices=DTYPE_NAMES,
                   help="auto: bfloat16 where the hardware has it natively, else float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--runtime", default="auto", choices=RUNTIMES,
                   help="native: specdec's own runtime (GGUF files and registry models of the Llama family in "
                        "int4 or int8 on the CPU: one C++ call per forward); hf: transformers' model with specdec's forward; auto: "
                        "native where it runs the model as asked, else hf")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a local model folder to run its own Python code")


def add_method_args(p: argparse.ArgumentParser, default: str) -> None:
    """--proposer SPEC and the flags that fold into it (generate, check)."""
    p.add_argument("--proposer", default=default, metavar="SPEC",
                   help=f"a method spec, KIND[:OPTION=VALUE]... with KIND one of {', '.join(KINDS)} (none = ar, "
                        "plain decoding), e.g. draft:k=4:quant=int8; auto: what `specdec advise` measured best for "
                        "this target, draft and machine (plain decoding where speculation does not pay); hybrid: "
                        "prompt lookup when an n-gram matches, the draft model otherwise")
    p.add_argument("-k", type=int, default=None, help="k=: tokens proposed per round (default 2)")
    p.add_argument("--max-ngram", type=int, default=None, help="ngram=: longest n-gram prompt lookup matches (3)")
    p.add_argument("--tree-width", type=int, default=None, metavar="W",
                   help="width=: tree speculation, beside each draft guess its W-1 next most likely tokens as "
                        "alternatives, all verified in one target forward (1 = a plain chain)")
    p.add_argument("--min-confidence", type=float, default=None, metavar="P",
                   help="conf=: adaptive k, a round stops guessing after a draft probability below P")
    p.add_argument("--pay-rule", metavar="FILE",
                   help="pay=1: adaptive k by the cost model, a round stops guessing when one more guess is not "
                        "expected to pay, judged from the cost terms in FILE (the JSON of `specdec advise --json` "
                        "for this pair); -k is then the most a round guesses")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=_min_p, default=0.0, metavar="P",
                   help="keep the tokens at least P times as likely as the most likely one (llama.cpp's "
                        "min-p; 0 = off, its default chain uses 0.05)")
    p.add_argument("--seed", type=int, default=None)


def _min_p(text: str) -> float:
    """--min-p's value: a number in [0, 1), or argparse's error that says what to give."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(
            f"must be a number in [0, 1), got {text!r}: 0 turns min-p off, 0.05 is llama.cpp's default")
    return value


def add_penalty_args(p: argparse.ArgumentParser) -> None:
    """Penalties and logit bias (decode.penalties), applied to the target's and the draft's rows alike."""
    p.add_argument("--presence-penalty", type=float, default=0.0, metavar="F",
                   help="OpenAI's: subtract F from each token already generated (in [-2, 2]; 0 = off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, metavar="F",
                   help="OpenAI's: subtract F times the times each token was generated (in [-2, 2]; 0 = off)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, metavar="F",
                   help="llama.cpp's: divide a positive logit (multiply a negative one) by F for each token in the "
                        "last --repeat-last-n tokens of prompt and output (1 = off)")
    p.add_argument("--repeat-last-n", type=int, default=64, metavar="N",
                   help="the window of --repeat-penalty (64, llama.cpp's default; -1 = the whole sequence)")
    p.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS",
                   help="add BIAS (in [-100, 100]) to token ID's logit; repeat the flag for more tokens")


def penalties_of(args: argparse.Namespace):
    """The decode.penalties.Penalties the flags ask for (checked now, before any model loads)."""
    from ..decode.penalties import Penalties
    from ..errors import SpecdecError

    if args.repeat_last_n < -1:
        raise SpecdecError(f"--repeat-last-n must be -1 (the whole sequence), 0 (off) or more, got {args.repeat_last_n}")
    bias = []
    for item in args.logit_bias:
        token, _, value = item.partition("=")
        try:
            bias.append((int(token), float(value)))
        except ValueError:
            raise SpecdecError(f"--logit-bias takes ID=BIAS, such as 15043=-100, got {item!r}") from None
    return Penalties(args.presence_penalty, args.frequency_penalty, args.repeat_penalty,
                     None if args.repeat_last_n == -1 else args.repeat_last_n, tuple(bias))
