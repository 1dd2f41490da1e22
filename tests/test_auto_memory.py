"""What `auto` runs in a server and elsewhere: `specdec serve` adds the memory of earlier requests
to the draft chain auto picks (suffix+draft with the same draft and round options); `specdec
generate`, one prompt whose memory would hold nothing, runs auto's pick as before."""

from __future__ import annotations

import pytest

from specdec.cli import build_parser
from specdec.cli.args import method_of
from specdec.methods.spec import in_conversation, parse, remembering, resolve_auto
from specdec.tune.saved import DEFAULT_CHOICE

ZEN5 = DEFAULT_CHOICE["cpu-bf16"]  # draft:k=4:quant=int3:vocab=32768:conf=0.6


def served(*flags: str, command: str = "serve"):
    return in_conversation(method_of(build_parser().parse_args([command, *flags])))


def test_serve_runs_autos_draft_with_the_memory():
    """The new choice, pinned: with no --proposer (or --proposer auto), on the Zen 5's kind of CPU
    without saved advice, the server runs the int3 draft of auto's default with the memory."""
    for method in (served(), served("--proposer", "auto")):
        assert method.label == "auto:memory=1"
        resolved, dropped = resolve_auto(method, parse(ZEN5))
        assert resolved.label == "suffix+draft:k=4:quant=int3:vocab=32768:conf=0.6" and dropped == []
    # auto's own options still apply to the draft it picked; memory=0 turns the memory off
    assert resolve_auto(served("--proposer", "auto", "-k", "6"), parse(ZEN5))[0].label == \
        "suffix+draft:k=6:quant=int3:vocab=32768:conf=0.6"
    assert resolve_auto(served("--proposer", "auto:memory=0"), parse(ZEN5))[0] == parse(ZEN5)
    assert served("--proposer", "draft:k=3").label == "draft:k=3"  # a named method runs as named
    assert served(command="chat").label == "auto:memory=1"  # a terminal conversation remembers its turns too


def test_generate_runs_autos_pick_without_the_memory():
    args = build_parser().parse_args(["generate", "--prompt", "hi"])
    method = method_of(args)
    assert method.memory is None and resolve_auto(method, parse(ZEN5))[0] == parse(ZEN5)


@pytest.mark.parametrize("chosen, runs", [
    ("draft:k=5:quant=int3:vocab=32768:conf=0.6", "suffix+draft:k=5:quant=int3:vocab=32768:conf=0.6"),
    ("draft:k=2:quant=int8", "suffix+draft:k=2:quant=int8"),
    ("draft:k=4:dyn=1", "suffix+draft:k=4:dyn=1"),
    ("draft:k=3:width=2", "draft:k=3:width=2"),  # a tree: suffix+draft guesses chains
    ("hybrid:k=3:quant=int4:vocab=32768", "hybrid:k=3:ngram=3:quant=int4:vocab=32768"),
    ("ar", "ar"),  # speculation does not pay here: nor does the memory's verify rows
])
def test_the_memory_joins_draft_chains_only(chosen, runs):
    assert remembering(parse(chosen)).label == runs
    assert resolve_auto(parse("auto:memory=1"), parse(chosen))[0].label == runs
