"""`specdec generate`'s penalty flags: --presence-penalty, --frequency-penalty, --repeat-penalty
with --repeat-last-n, --logit-bias ID=BIAS; speculative output equal to plain decoding with the
same flags, a forced token forced, bad values a one-line error before any model loads."""

import json

import pytest
from test_cli import DRAFT_PATHS, base_args, run

PENALISED = ("--presence-penalty", "0.7", "--frequency-penalty", "0.4", "--repeat-penalty", "1.4",
             "--repeat-last-n", "8", "--logit-bias", "3=1.5", "--logit-bias", "9=-100")


def tokens(capsys, registry, *extra) -> list[int]:
    code, out, err = run(capsys, *base_args(registry, "--json", "--max-new-tokens", "24", *extra))
    assert code == 0, err
    return json.loads(out)["new_tokens"]


def test_penalised_speculation_equals_penalised_plain_decoding(capsys, tiny_registry):
    plain = tokens(capsys, tiny_registry, "--proposer", "none", *PENALISED)
    assert plain != tokens(capsys, tiny_registry, "--proposer", "none") and 9 not in plain
    for proposer, *extra in (("lookup",), *DRAFT_PATHS):
        assert tokens(capsys, tiny_registry, "--proposer", proposer, *extra, *PENALISED) == plain, (proposer, extra)


def test_a_logit_bias_of_100_forces_its_token(capsys, tiny_registry):
    assert tokens(capsys, tiny_registry, "--proposer", "draft", "--logit-bias", "17=100") == [17] * 24


@pytest.mark.parametrize("flags, message", [
    (("--presence-penalty", "3"), "presence penalty must be in [-2, 2]"),
    (("--repeat-penalty", "0"), "repetition penalty must be > 0"),
    (("--repeat-last-n", "-5"), "--repeat-last-n must be -1"),
    (("--logit-bias", "12"), "--logit-bias takes ID=BIAS"),
    (("--logit-bias", "12=500"), "must be in [-100, 100]"),
])
def test_bad_penalty_flags_are_one_line_errors_before_loading(capsys, tiny_registry, flags, message):
    code, _, err = run(capsys, *base_args(tiny_registry, "--proposer", "draft", *flags))
    assert code != 0 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_bias_outside_the_vocabulary_is_an_error_once_the_vocabulary_is_known(capsys, tiny_registry):
    code, _, err = run(capsys, *base_args(tiny_registry, "--proposer", "draft", "--logit-bias", "64=1"))
    last = err.strip().splitlines()[-1]
    assert code != 0 and "token id 64, outside the vocabulary [0, 64)" in last and "Traceback" not in err
