"""The contracts between layers: both runtimes and every proposer are what decode.interface.Runtime
and decode.proposal.Proposer declare (checked on live objects, runtime_checkable), and no module
of specdec reaches one of their members by probing for it (getattr/hasattr with the member's
name): a member a caller needs belongs in the Protocol, which every runtime then implements."""

from __future__ import annotations

import ast
import copy
import inspect
from pathlib import Path

import pytest
from conftest import tiny_model
from test_runtime import tiny

import specdec
from specdec import DraftModel, Hybrid, PromptLookup, TreeDraft
from specdec.decode.interface import Runtime
from specdec.runtime.hf.causal_lm import CausalLM
from specdec.decode.proposal import Proposer
from specdec.runtime import from_transformers

SOURCE = Path(specdec.__file__).parent
# A batch's plan (decode.batch.Plan, a decode.plan.Planner) has an `observe` of its own, told
# apart from a proposer's by what holds it.
NOT_A_RUNTIME_OR_PROPOSER = {"plan"}


def _members(protocol: type) -> set[str]:
    """The members a Protocol declares (annotations, methods and properties)."""
    declared = set(getattr(protocol, "__annotations__", {}))
    declared |= {name for name, value in vars(protocol).items()
                 if not name.startswith("_") and (callable(value) or isinstance(value, property))}
    return declared


RUNTIME_MEMBERS = _members(Runtime)
PROPOSER_MEMBERS = _members(Proposer)


def test_the_protocols_declare_what_batches_and_servers_use():
    """The members callers once probed for are declared (a test of this test's _members too)."""
    assert {"forward_lanes", "lane", "release", "shares_forward", "prefill", "length"} <= RUNTIME_MEMBERS
    assert {"fork", "drafting", "draft_lm", "propose", "may_lag", "k"} <= PROPOSER_MEMBERS


def _runtimes() -> dict[str, Runtime]:
    native = from_transformers(copy.deepcopy(tiny("qwen2")), "int4", capacity=64)
    hf = CausalLM(tiny_model(1))
    return {"native": native, "native lane": native.lane(), "hf": hf, "hf lane": hf.lane(),
            "hf draft": CausalLM(tiny_model(2), invariant=False)}


@pytest.fixture(scope="module")
def runtimes() -> dict[str, Runtime]:
    return _runtimes()


def test_both_runtimes_and_their_lanes_are_runtimes(runtimes):
    for name, lm in runtimes.items():
        assert isinstance(lm, Runtime), name
        for member in RUNTIME_MEMBERS:  # methods are callable, the rest plain values
            declared = getattr(Runtime, member, None)
            assert callable(getattr(lm, member)) == callable(declared) or isinstance(declared, property), (name, member)
        assert lm.shares_forward is (name.startswith("native")), name


def test_a_transformers_model_is_not_a_runtime():
    assert not isinstance(tiny_model(1), Runtime)


def test_every_proposer_is_a_proposer_and_so_are_its_forks(runtimes):
    for draft_name in ("native", "hf draft"):
        draft = DraftModel(runtimes[draft_name], k=3)
        proposers = {"draft": draft, "hybrid": Hybrid(draft, PromptLookup(3)), "tree": TreeDraft(draft, width=2),
                     "lookup": PromptLookup(3)}
        for name, proposer in proposers.items():
            assert isinstance(proposer, Proposer), (draft_name, name)
            fork = proposer.fork(32)
            assert isinstance(fork, Proposer), (draft_name, name)
            if proposer.draft_lm is not None:  # a fork drafts on a lane of its own, the same weights
                assert fork.draft_lm is not proposer.draft_lm and isinstance(fork.draft_lm, Runtime)


def probes(tree: ast.AST, names: set[str]) -> list[tuple[int, str, str]]:
    """(line, getattr/hasattr, member) for each probe of one of `names` by a constant name,
    but on what NOT_A_RUNTIME_OR_PROPOSER names."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2):
            continue
        held, name = node.args[0], node.args[1]
        if not (isinstance(name, ast.Constant) and name.value in names):
            continue
        holder = held.attr if isinstance(held, ast.Attribute) else held.id if isinstance(held, ast.Name) else ""
        if holder not in NOT_A_RUNTIME_OR_PROPOSER:
            found.append((node.lineno, node.func.id, name.value))
    return found


def test_the_probe_finder_finds_probes():
    code = ("getattr(blocks[0][0], 'forward_lanes', None)\nhasattr(self.drafter, 'drafting')\n"
            "getattr(self.plan, 'observe', None)\ngetattr(x, 'unrelated')\n")
    assert probes(ast.parse(code), RUNTIME_MEMBERS | PROPOSER_MEMBERS) == [
        (1, "getattr", "forward_lanes"), (2, "hasattr", "drafting")]


def test_no_module_probes_for_a_runtime_or_proposer_member():
    names = RUNTIME_MEMBERS | PROPOSER_MEMBERS
    found = {str(path.relative_to(SOURCE)): hits for path in sorted(SOURCE.rglob("*.py"))
             if (hits := probes(ast.parse(path.read_text(), str(path)), names))}
    assert not found, f"members reached by probing instead of through the Protocols: {found}"


def test_the_protocol_methods_take_what_the_runtimes_take(runtimes):
    """Each runtime's methods accept the Protocol's parameters by the same names."""
    for name, lm in runtimes.items():
        for member in RUNTIME_MEMBERS:
            declared = getattr(Runtime, member, None)
            if not callable(declared) or isinstance(declared, property):
                continue
            wanted = [p for p in inspect.signature(declared).parameters if p != "self"]
            have = list(inspect.signature(getattr(lm, member)).parameters)
            assert have[: len(wanted)] == wanted, (name, member, have, wanted)
