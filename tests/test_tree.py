"""Tree speculation: the draft's chain plus alternative leaves, scored in one target forward.

Greedy output equals plain decoding; forward_tree's rows equal chain forwards of each
root-to-node path and the compacted cache equals a plain forward of the committed tokens;
sampled output follows the target's exact distribution (the chi-square tests and thresholds of
test_sampling_exactness.py); verify_tree's alignment on hand-built rows.
"""

from collections import Counter

import pytest
import torch
from conftest import perturbed, tiny_model
from test_sampling_exactness import CAUGHT, CONFIGS, PASS, make_pair, pvalues

from specdec import DraftModel, TreeDraft, generate
from specdec.conform.check import chi2_pvalue
from specdec.decode import sequence, verify_tree
from specdec.runtime.hf.causal_lm import CausalLM
from specdec.decode.proposal import Proposal
from specdec.decode.sampling import SamplingConfig, probs
from specdec.proposers.policy import ConfidenceFloor

GREEDY = SamplingConfig(0.0)


def chain_length(parents: torch.Tensor) -> int:
    """TreeDraft lays out its chain first: nodes 0..m-1 with parents -1, 0, ..., m-2."""
    parents = parents.tolist()
    return next((i for i, p in enumerate(parents) if p != i - 1), len(parents))


@pytest.fixture
def leaf_spy(monkeypatch):
    """Counts rounds whose accepted path ends in an alternative leaf (not a chain node)."""
    seen = Counter()

    def spy(rows, proposal, cfg, generator):
        path, next_token = verify_tree.verify_tree(rows, proposal, cfg, generator)
        seen["rounds"] += 1
        seen["leaf"] += bool(path) and path[-1] >= chain_length(proposal.parents)
        return path, next_token

    monkeypatch.setattr(sequence, "verify_tree", spy)
    return seen


# --- greedy equality -------------------------------------------------------------------------

def case(seed: int, scale: float):
    target = tiny_model(100 + seed)
    draft = perturbed(target, seed=seed, scale=scale)
    gen = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 64, (6,), generator=gen)
    prompt = torch.cat([base, torch.randint(0, 64, (3,), generator=gen), base])
    plain = generate(target, prompt, max_new_tokens=40, eos_token_id=[]).new_tokens
    return target, draft, prompt, plain


@pytest.fixture(scope="module", params=[(0, 0.2), (1, 0.4), (2, 0.2)], ids=lambda p: f"seed{p[0]}")
def seeded(request):
    return case(*request.param)


def test_tree_greedy_equals_plain(seeded, leaf_spy):
    target, draft, prompt, plain = seeded
    for k in range(1, 6):
        for width in range(1, 4):
            drafter = TreeDraft(DraftModel(draft, k), width=width)
            out = generate(target, prompt, drafter=drafter, max_new_tokens=40, eos_token_id=[], check=True)
            assert out.new_tokens == plain, (k, width)
            assert out.finish_reason == "length"
            assert out.stats.target_calls == out.stats.rounds + 1
            assert out.stats.accepted + out.stats.rounds + 1 == 40
            # a draft forward per chain token; each brings width-1 alternative leaves (advise prices this)
            assert out.stats.proposed_lengths == [width * steps for steps in out.stats.draft_steps], (k, width)
    assert leaf_spy["leaf"] > 0, leaf_spy  # alternative leaves were accepted, and still equal


def test_self_draft_and_branch_threshold(seeded):
    target, draft, prompt, plain = seeded
    # the target as its own draft: every chain is accepted, the bonus comes from the last row
    out = generate(target, prompt, drafter=TreeDraft(DraftModel(target, 4), width=3), max_new_tokens=40,
                   eos_token_id=[], check=True)
    assert out.new_tokens == plain and out.stats.rounds < 40 / 4
    # adaptive chain length (the draft's min_confidence) still equals plain decoding
    adaptive = generate(target, prompt, drafter=TreeDraft(DraftModel(draft, 4, policy=ConfidenceFloor(0.3)), width=2),
                        max_new_tokens=40, eos_token_id=[], check=True)
    assert adaptive.new_tokens == plain


@pytest.mark.parametrize("k", [2, 4])
def test_tree_eos_at_every_position(seeded, k):
    target, draft, prompt, plain = seeded
    for pos in range(len(plain)):
        eos = plain[pos]
        expected = plain[: plain.index(eos) + 1]
        drafter = TreeDraft(DraftModel(draft, k), width=3)
        out = generate(target, prompt, drafter=drafter, max_new_tokens=40, eos_token_id=eos, check=True)
        assert out.new_tokens == expected, pos
        assert out.finish_reason == "eos"


@pytest.mark.parametrize("max_new", [1, 2, 3, 5])
def test_tree_max_new_tokens_smaller_than_k(seeded, max_new):
    target, draft, prompt, plain = seeded
    for drafter in (TreeDraft(DraftModel(draft, 8), width=3), TreeDraft(DraftModel(target, 8), width=2)):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=max_new, eos_token_id=[], check=True)
        assert out.new_tokens == plain[:max_new]
        assert out.finish_reason == "length"


# --- forward_tree and the cache --------------------------------------------------------------

PARENTS = [-1, 0, 1, -1, 0, 3, -1, 5]  # three root children, depth up to 3, siblings at two levels


def path_to(parents: list[int], node: int) -> list[int]:
    path = []
    while node != -1:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("attention,gqa,preallocate",
                         [("sdpa", "1", True), ("sdpa", "0", True), ("eager", "1", True), ("sdpa", "1", False)])
def test_forward_tree_rows_and_compacted_cache(monkeypatch, attention, gqa, preallocate):
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", gqa)
    model = tiny_model(7)
    model.set_attn_implementation(attention)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 64, (9,), generator=gen)
    nodes = torch.randint(0, 64, (len(PARENTS),), generator=gen)
    lm = CausalLM(model, preallocate=preallocate)
    lm.prefill(prompt[:-1])
    rows = lm.forward_tree(torch.cat([prompt[-1:], nodes]), torch.tensor(PARENTS))
    assert rows.shape == (len(PARENTS) + 1, 64)
    assert lm.length == len(prompt) + len(PARENTS)
    ref = CausalLM(model)
    for node in range(-1, len(PARENTS)):
        ref.prefill(prompt[:-1])
        chain = ref.forward(torch.cat([prompt[-1:], nodes[path_to(PARENTS, node)]]))
        torch.testing.assert_close(rows[node + 1], chain[-1], atol=1e-4, rtol=0)

    path = path_to(PARENTS, 7)  # [3, 5, 7]: a path that skips other nodes' positions
    lm.keep_positions(len(prompt), path)
    committed = torch.cat([prompt, nodes[path]])
    assert lm.length == len(committed) and torch.equal(lm._held[: lm.length], committed)
    following = torch.tensor([5])
    after = lm.forward(following)[-1]
    expected = CausalLM(model).prefill(torch.cat([committed, following]))[-1]
    torch.testing.assert_close(after, expected, atol=1e-4, rtol=0)


def test_keep_positions_rejects_bad_offsets():
    lm = CausalLM(tiny_model(7))
    lm.prefill(torch.arange(6))
    for offsets in ([2, 1], [0, 0], [6], [-1]):
        with pytest.raises(ValueError):
            lm.keep_positions(0, offsets)


# --- verify_tree on hand-built rows ----------------------------------------------------------

V = 8
A, B, C, D = 1, 2, 3, 4
# node 0 = A (root child), node 1 = B (root child), node 2 = C (child of A), node 3 = D (child of B)
TREE = Proposal(torch.tensor([A, B, C, D]), parents=torch.tensor([-1, -1, 0, 1]))


def peaked(*tokens: int) -> torch.Tensor:
    """Rows whose argmax (and, at temperature 1, practically all mass) is the given token."""
    rows = torch.zeros(len(tokens), V)
    rows[torch.arange(len(tokens)), torch.tensor(tokens)] = 50.0
    return rows


def test_verify_tree_greedy_alignment():
    # rows: root, A, B, C, D. The root's row picks B (the second child); B's row (rows[2])
    # picks D; D's row (rows[4]) gives the next token.
    rows = peaked(B, 7, D, 7, 6)
    path, next_token = verify_tree.verify_tree(rows, TREE, GREEDY, None)
    assert path == [1, 3] and next_token.tolist() == [6]
    # the root's row picks A, A's row (rows[1]) picks 5: no child matches, 5 is the next token
    path, next_token = verify_tree.verify_tree(peaked(A, 5, 7, 7, 7), TREE, GREEDY, None)
    assert path == [0] and next_token.tolist() == [5]
    # nothing matches at the root
    path, next_token = verify_tree.verify_tree(peaked(6, 7, 7, 7, 7), TREE, GREEDY, None)
    assert path == [] and next_token.tolist() == [6]


def test_verify_tree_sampling_alignment():
    cfg = SamplingConfig(1.0)
    gen = torch.Generator().manual_seed(0)
    # A was sampled from q but the target gives it no mass: rejected; B (a point mass) has all
    # of the residual: accepted; then B's row, rows[2], decides D.
    q = torch.full((4, V), 1 / V)
    sampled = torch.tensor([True, False, True, False])
    tree = Proposal(TREE.tokens, q, parents=TREE.parents, sampled=sampled)
    for _ in range(20):
        path, next_token = verify_tree.verify_tree(peaked(B, 7, D, 7, 6), tree, cfg, gen)
        assert path == [1, 3] and next_token.tolist() == [6]
        path, next_token = verify_tree.verify_tree(peaked(B, 7, 5, 7, 6), tree, cfg, gen)
        assert path == [1] and next_token.tolist() == [5]


def test_one_level_rule_on_random_distributions():
    """Root with three children: sampled from q1, a point mass t, sampled from q3 (drawn
    independently). The committed first token is distributed as p, whatever p, q1, q3, t."""
    gen = torch.Generator().manual_seed(1)
    cfg = SamplingConfig(1.0)
    for trial in range(3):
        rows = torch.randn(4, V, generator=gen) * 2
        q = torch.softmax(torch.randn(3, V, generator=gen) * 2, -1)
        p = probs(rows[0], cfg)
        t = int(torch.randint(0, V, (1,), generator=gen))
        n, counts = 8000, Counter()
        for _ in range(n):
            x1, x3 = (int(torch.multinomial(q[i], 1, generator=gen)) for i in (0, 2))
            tree = Proposal(torch.tensor([x1, t, x3]), q, parents=torch.tensor([-1, -1, -1]),
                            sampled=torch.tensor([True, False, True]))
            path, next_token = verify_tree.verify_tree(rows, tree, cfg, gen)
            counts[(int(tree.tokens[path[0]]) if path else int(next_token),)] += 1
        expected = {(x,): float(p[x]) for x in range(V)}
        assert chi2_pvalue(counts, expected, n)[0] > PASS, trial


# --- exact sampling through the engine -------------------------------------------------------

@pytest.fixture(scope="module")
def pair():
    return make_pair(0)


@pytest.mark.parametrize("width", [2, 3])
def test_tree_sampling_matches_target(pair, width, leaf_spy):
    target, draft = pair
    ps = pvalues(target, TreeDraft(DraftModel(draft, 3), width=width), CONFIGS["plain"])
    assert min(ps) > PASS, ps
    assert leaf_spy["leaf"] >= 50, leaf_spy  # the alternatives' acceptance rule was exercised


def test_keeping_a_rejected_point_mass_is_caught(pair, monkeypatch):
    """The classic tree bug: after rejecting a deterministic sibling, sampling from r without
    zeroing its token (so it can come out again, too often)."""
    target, draft = pair
    right = verify_tree.residual

    def wrong(r, q, tokens):
        return r if q is None else right(r, q, tokens)

    monkeypatch.setattr(verify_tree, "residual", wrong)
    ps = pvalues(target, TreeDraft(DraftModel(draft, 3), width=3), CONFIGS["plain"])
    assert min(ps) < CAUGHT, ps
