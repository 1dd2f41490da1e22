"""Logits alignment: block row i is the target's prediction after the pending token and the
first i draft tokens, the same as serial decoding; the verifier judges draft[i] by row i."""

import torch

from specdec.runtime.hf.causal_lm import CausalLM
from specdec.decode.sampling import SamplingConfig
from specdec.decode.verify import verify_greedy, verify_sampling

PROMPT = [3, 14, 15, 9, 26]
BLOCK = [53, 5, 8, 9]  # pending token, then three draft tokens


def test_block_rows_equal_serial_decoding(target):
    serial = CausalLM(target)
    serial.forward(torch.tensor(PROMPT))
    serial_rows = torch.cat([serial.forward(torch.tensor([t])) for t in BLOCK])
    block = CausalLM(target)
    block.forward(torch.tensor(PROMPT))
    block_rows = block.forward(torch.tensor(BLOCK))
    torch.testing.assert_close(block_rows, serial_rows, rtol=1e-5, atol=1e-5)


def one_hot_rows(choices: list[int], vocab: int = 16) -> torch.Tensor:
    rows = torch.zeros(len(choices), vocab)
    rows[torch.arange(len(choices)), torch.tensor(choices)] = 10.0
    return rows


def test_greedy_verifier_judges_candidate_i_by_row_i():
    rows = one_hot_rows([7, 2, 9, 4])  # target says 7, then 2 after 7, then 9, bonus 4
    assert verify_greedy(rows, torch.tensor([7, 2, 9])).accepted == 3
    assert verify_greedy(rows, torch.tensor([7, 2, 9])).next_token.item() == 4  # bonus: last row
    v = verify_greedy(rows, torch.tensor([7, 3, 9]))
    assert (v.accepted, v.next_token.item()) == (1, 2)  # replacement from row 1
    v = verify_greedy(rows, torch.tensor([2, 7, 9]))  # shifted by one row: rejected at once
    assert (v.accepted, v.next_token.item()) == (0, 7)


def test_sampling_verifier_uses_the_same_rows():
    """With point-mass p rows the sampling rule must act exactly like the greedy one."""
    rows = one_hot_rows([7, 2, 9, 4]) * 10
    cfg = SamplingConfig(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    for draft, expected in [([7, 2, 9], (3, 4)), ([7, 3, 9], (1, 2)), ([2, 7, 9], (0, 7))]:
        v = verify_sampling(rows, torch.tensor(draft), None, cfg, gen)
        assert (v.accepted, v.next_token.item()) == expected


def test_real_block_through_the_verifier(target):
    """Serial greedy tokens proposed as a block are all accepted, and the bonus is the next
    serial token; changing one makes the verifier reject exactly there."""
    serial = CausalLM(target)
    logits = serial.forward(torch.tensor(PROMPT))[-1]
    greedy = []
    for _ in range(5):
        greedy.append(int(logits.argmax()))
        logits = serial.forward(torch.tensor(greedy[-1:]))[-1]
    pending, drafts, bonus = greedy[0], greedy[1:4], greedy[4]
    block = CausalLM(target)
    block.forward(torch.tensor(PROMPT))
    rows = block.forward(torch.tensor([pending] + drafts))
    v = verify_greedy(rows, torch.tensor(drafts))
    assert (v.accepted, v.next_token.item()) == (3, bonus)
    wrong = drafts.copy()
    wrong[1] = (wrong[1] + 1) % 64
    v = verify_greedy(rows, torch.tensor(wrong))
    assert (v.accepted, v.next_token.item()) == (1, drafts[1])


def test_gqa_switch_is_on_for_cpu_models_and_blocks_still_match_serial_steps(target):
    import os

    from specdec.runtime.hf.causal_lm import CausalLM
    from specdec.runtime.hf.prepare import GQA_SWITCH

    lm = CausalLM(target)
    assert os.environ.get(GQA_SWITCH) == "1"
    # a masked 5-row block (SDPA with enable_gqa) against five 1-row steps (no mask)
    prompt = torch.arange(20) % 50 + 1
    lm.prefill(prompt)
    block = lm.forward(torch.tensor([3, 9, 4, 7, 2]))
    lm.cache.trim(20)
    serial = torch.cat([lm.forward(torch.tensor([t])) for t in [3, 9, 4, 7, 2]])
    torch.testing.assert_close(block, serial, rtol=1e-4, atol=1e-4)
