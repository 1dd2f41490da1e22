"""The advice record: what `specdec advise` measured and recommends, as a typed, versioned file.

`specdec advise --json` prints one (`Advice.to_json`); `--pay-rule FILE` reads its cost terms
(`Advice.pay_rule`), `advise --acceptance FILE` its calibration, and `--proposer auto` its choice
(where advise saved it: specdec.tune.saved).

Version 2 names every proposer by its method spec (specdec.methods.spec): the draft variants as
"draft", "draft:quant=int8", the choice as a full spec ("draft:k=2:quant=int8", or "ar" where
speculation does not pay). Files without a version (advise before the method grammar) are read
through `_from_version_1`, so the committed reports in docs/advise stay usable. Version 3 added
the paired confirmation; version 4 what each calibration's rounds did (`Calibrated.rounds`) and
the round options ranked by full spec ("draft:k=2:quant=int4:width=2"); older versions lack only
fields with defaults.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..cost.model import Costs, Rounds
from ..errors import SpecdecError
from ..methods.spec import Method
from ..proposers.policy import PayRule

VERSION = 4
@dataclass(frozen=True)
class Calibrated:
    """One proposer's acceptance on the calibration prompts (greedy)."""

    rates: tuple[float, ...]  # by position, conditional on the earlier guesses
    hit_rate: float  # share of rounds in which it guessed at all
    histogram: tuple[int, ...] = ()  # rounds by accepted length, rounds that guessed
    acceptance_rate: float = 0.0  # accepted / proposed
    propose_per_round: float = 0.0  # seconds
    tokens_per_s: float = 0.0
    expected_tokens_measured: float = 0.0
    expected_tokens_iid: float | None = None
    draft_share: float = 1.0  # rounds the draft model proposed in (a hybrid's lookup rounds cost none)
    rounds: Rounds | None = None  # version 4: mean draft steps, blocks verified, tokens per round


@dataclass(frozen=True)
class Verdict:
    """The cost model's answer for one proposer: its best k and why."""

    k: int
    speedup: float | None
    reason: str
    speedup_by_k: dict[int, float] = field(default_factory=dict)
    alpha_fitted: float | None = None
    hit_rate: float | None = None
    break_even_alpha: dict[int, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    method: str  # a full method spec; "ar": speculation does not pay here
    predicted_speedup: float
    measured_speedup: float | None = None  # in the paired confirmation run (None: not confirmed)
    reason: str = ""


@dataclass(frozen=True)
class Confirmed:
    """One of the top predicted methods, run paired with plain decoding on the same prompts."""

    method: str
    predicted_speedup: float
    measured_speedup: float  # its tokens/s over plain decoding's, both pooled over the prompts
    tokens_per_s: float
    plain_tokens_per_s: float
    prompts: int
    tokens: int  # new tokens per generation


@dataclass(frozen=True)
class Advice:
    settings: dict
    device: str
    dtype: str
    c_target: float  # seconds of one target decode step at the settings' context
    verify: dict[int, float]  # C_V(k): seconds of a verify block of k guesses
    c_draft: dict[str, float]  # seconds of one draft step, by draft variant ("draft", "draft:quant=int8")
    calibration: dict[str, Calibrated]  # by proposer family ("draft:quant=int8", "lookup:ngram=3")
    proposers: dict[str, Verdict]
    choice: Choice
    plain_tokens_per_s: float = 0.0
    bandwidth: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    acceptance_from: str = "measured"
    calibration_prompts: list[str] | str = field(default_factory=list)
    random_weights: bool = False
    environment: dict = field(default_factory=dict)  # specdec.machine.environment
    setup: dict | None = None  # the Setup it was saved under (advise fills it in)
    confirmed: list[Confirmed] = field(default_factory=list)  # version 3: predicted against measured
    not_ranked: dict[str, str] = field(default_factory=dict)  # families and options left out, and why
    llamacpp: dict = field(default_factory=dict)  # llama.cpp's plain decoding of the same GGUF, where installed
    version: int = VERSION

    def to_json(self) -> dict:
        return {"version": self.version, **{k: v for k, v in asdict(self).items() if k != "version"}}

    @classmethod
    def from_json(cls, data: dict) -> Advice:
        if "version" not in data:
            data = _from_version_1(data)
        elif data["version"] not in (2, 3, VERSION):  # older versions lack only fields with defaults
            raise ValueError(f"advice version {data['version']}; this specdec reads 1 to {VERSION}")
        ints = lambda d: {int(k): v for k, v in d.items()}  # JSON keeps int keys as strings
        plain = {f.name for f in fields(cls)} - {"verify", "calibration", "proposers", "choice", "confirmed", "version"}
        return cls(
            **{k: v for k, v in data.items() if k in plain},
            verify={int(k): float(v) for k, v in data["verify"].items()},
            calibration={name: _calibrated(c) for name, c in data["calibration"].items()},
            proposers={name: Verdict(**{**v, "speedup_by_k": ints(v.get("speedup_by_k", {})),
                                        "break_even_alpha": ints(v.get("break_even_alpha", {}))})
                       for name, v in data["proposers"].items()},
            choice=Choice(**data["choice"]),
            confirmed=[Confirmed(**c) for c in data.get("confirmed", [])],
        )

    @classmethod
    def load(cls, path: str | Path) -> Advice:
        try:
            return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SpecdecError(f"cannot read advice from {path} ({e}): give the JSON report of "
                               "`specdec advise --json` for this target and draft") from None

    def pay_rule(self, method: Method) -> PayRule:
        """The cost terms a method with pay=1 stops by (specdec.proposers.policy), up to its k."""
        return pay_rule(method, self.c_target, self.verify, self.c_draft)

    def rule_for(self, method: Method) -> PayRule | None:
        """The pay rule a method runs with: its own for pay=1, none otherwise."""
        return rule_for(method, self.c_target, self.verify, self.c_draft)


def draft_cost(method: Method, c_draft: dict[str, float]) -> float:
    """C_D of the draft a method runs, from advise's costs by draft variant; a restricted head
    without its own measurement is charged its full-head draft's cost."""
    for variant in (Method("draft", quant=method.quant, vocab=method.vocab), Method("draft", quant=method.quant)):
        if variant.label in c_draft:
            return c_draft[variant.label]
    raise SpecdecError(f"this advice has no cost of the draft {Method('draft', quant=method.quant).label} "
                       f"(measured: {', '.join(c_draft) or 'none'}): run `specdec advise` with that draft")


def pay_rule(method: Method, c_target: float, verify: dict[int, float], c_draft: dict[str, float]) -> PayRule:
    """The rule a method with pay=1 stops by (specdec.proposers.policy), up to its k, from
    advise's cost terms: a record's (--pay-rule FILE), or those the advise run that calibrates
    the method has just measured."""
    cost = draft_cost(method, c_draft)
    return PayRule.from_costs(Costs(c_target, cost, verify), cost, method.k)


def rule_for(method: Method, c_target: float, verify: dict[int, float], c_draft: dict[str, float]) -> PayRule | None:
    """pay_rule for a method with pay=1, None for any other."""
    return pay_rule(method, c_target, verify, c_draft) if method.pay else None


def _calibrated(record: dict) -> Calibrated:
    rounds = record.get("rounds")
    if rounds is not None:  # JSON keeps the block sizes as strings
        rounds = Rounds(rounds["draft_steps"], {int(n): share for n, share in rounds["blocks"].items()},
                        rounds["tokens"])
    return Calibrated(**{**record, "rates": tuple(record["rates"]), "histogram": tuple(record.get("histogram", ())),
                         "rounds": rounds})


def _from_version_1(old: dict) -> dict:
    """An advise report written before the method grammar: proposers named draft, draft-int8
    and lookup, the choice as (proposer, k), the int8 draft's cost beside the draft's."""
    names = {"draft": "draft", "draft-int8": "draft:quant=int8", "lookup": "lookup:ngram=3"}
    calibration = {names[n]: c for n, c in old["calibration"].items()}
    c_draft = {}
    if "draft" in old["calibration"] and old.get("c_draft") is not None:
        c_draft["draft"] = old["c_draft"]
    if old.get("c_draft_int8") is not None:
        c_draft["draft:quant=int8"] = old["c_draft_int8"]
    choice = old["choice"]
    fields_ = ("settings", "device", "dtype", "c_target", "verify", "plain_tokens_per_s", "bandwidth", "memory",
               "acceptance_from", "calibration_prompts", "random_weights")
    return {**{k: old[k] for k in fields_ if k in old}, "version": VERSION, "c_draft": c_draft,
            "calibration": calibration,
            "proposers": {names[n]: v for n, v in old.get("proposers", {}).items()},
            "choice": {"method": old_choice(choice["proposer"], int(choice["k"])),
                       "predicted_speedup": choice.get("predicted_speedup", 1.0)}}


def old_choice(proposer: str, k: int) -> str:
    return {"none": "ar", "draft-int8": f"draft:k={k}:quant=int8"}.get(proposer, f"{proposer}:k={k}")
