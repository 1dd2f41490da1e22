"""What to load, as one typed, frozen record: the models, how their weights are read and where
they run, and the method whose proposer is built (specdec.load.choose decides what `auto`
means; specdec.load.loaded loads it).

Every command that loads models builds one LoadSpec from its arguments (specdec.cli.args.spec_of),
and so do the server, the measurement scripts, the tests and library code: nothing below the
command line reads an argparse Namespace.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecdecError
from ..methods.spec import Method
from ..models.target_form import TARGET_FORMS
from ..registry import DEFAULT_DRAFT, DEFAULT_TARGET
from ..runtime.choose import RUNTIMES

PLAIN = Method("ar")
DTYPE_NAMES = ("auto", "bfloat16", "float16", "float32")  # specdec.models.load.DTYPES and its "auto"


@dataclass(frozen=True)
class LoadSpec:
    """target, draft: a registry name, a GGUF file (or a folder holding one) or a Hugging Face
    folder (the defaults: `specdec generate`'s pair); draft "none": no draft model. method: the
    method whose proposer `load` builds (its quant= and vocab= say the draft's form; `auto`: what
    saved advice or the device default chose). target_quant: the target's linear layers as codes
    ("auto": the fastest lossless form of the model as shipped, specdec.models.target_form);
    quant_group: int4 groups of a folder rounded to int4. runtime: "native", "hf" or "auto"
    (specdec.runtime.choose). pay_rule: the advice file whose cost terms a method with pay=1 stops
    by."""

    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    method: Method = PLAIN
    dtype: str = "auto"
    device: str = "cpu"
    runtime: str = "auto"
    target_quant: str = "auto"
    quant_group: int = 32
    trust_remote_code: bool = False
    pay_rule: str | None = None

    def __post_init__(self) -> None:
        """The choices a field has, as one-line errors (the values' other checks need the models'
        metadata: specdec.load.choose)."""
        for name, allowed in (("dtype", DTYPE_NAMES), ("runtime", RUNTIMES), ("target_quant", TARGET_FORMS)):
            value = getattr(self, name)
            if value not in allowed:
                raise SpecdecError(f"unknown {name} {value!r}; use one of: {', '.join(allowed)}")
