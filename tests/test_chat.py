"""`specdec chat` (cli.chat, cli.conversation) on tiny GGUF files on the native runtime
(tests/gguf_files.py: a two-layer qwen2 target and a one-layer draft from the same seed, which
shares the target's first layer so some guesses are accepted; SmolLM2's tokenizer cut to 2048
tokens, with its chat template).

What must hold:
- each turn's answer equals specdec.generate's for the whole conversation's prompt from a cold
  cache (fresh models), bit for bit: greedy with every proposer (and equal to plain decoding),
  seeded sampling with the draft; turns after the first take their prompt's start from the cache;
- a follow-up turn forwards through the target and through the draft exactly the prompt tokens
  their caches do not hold (rows counted at each decoder), and they hold at least the whole
  previous prompt; after /reset the whole prompt again;
- Ctrl-C (SIGINT) during a turn: one press stops it after the round in flight, two stop it at
  once; the partial answer stays in the history, the conversation goes on and its next answer
  still equals a cold generation (after two presses that turn prefills from nothing);
- a conversation that reaches the model's context: the answer is cut there, the next message is
  a one-line error and leaves the history as it was;
- in a real pseudo-terminal, `specdec chat` as a person runs it: three turns whose answers
  appear with a speed line each, /reset, Ctrl-C stopping a long answer (the program goes on),
  end of input and two Ctrl-C at the prompt each exiting with status 0.
"""

from __future__ import annotations

import codecs
import os
import pty
import re
import select
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from gguf_files import T, write_model

from specdec import DraftModel, Hybrid, PromptLookup, generate
from specdec.cli.chat import answer, read_message
from specdec.cli.conversation import Conversation, Sampling
from specdec.cli.stream import Streamer
from specdec.errors import SpecdecError
from specdec.files import cache_root
from specdec.gguf import tokenizer_of
from specdec.runtime import load_gguf
from specdec.runtime.rows import shared_prefix

MESSAGES = ["hello there", "tell me more about it", "and then what happened?"]
CONTEXT = 2048  # the tiny files' context length (gguf_files.write_model)


@dataclass(frozen=True)
class Files:
    folder: Path
    target: str
    draft: str


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The pair, and a model cache of the module's own for their prepared parts (the compiled
    kernels are the user's, linked: compiled once per CPU)."""
    folder = tmp_path_factory.mktemp("chat")
    kernels = cache_root() / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    (folder / "cache").mkdir()
    (folder / "cache" / "kernels").symlink_to(kernels)
    target = write_model(folder / "target.gguf", "qwen2", T.Q8_0, seed=1)
    draft = write_model(folder / "draft.gguf", "qwen2", T.Q8_0, seed=1, layers=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_CACHE", str(folder / "cache"))
        yield Files(folder, str(target), str(draft))


PROPOSERS = {
    "none": lambda f: None,
    "draft": lambda f: DraftModel(load_gguf(f.draft), k=3),
    "lookup": lambda f: PromptLookup(k=3),
    "hybrid": lambda f: Hybrid(DraftModel(load_gguf(f.draft), k=3), PromptLookup(k=3)),
}


def conversation(files: Files, proposer: str = "draft", **sampling) -> Conversation:
    return Conversation(load_gguf(files.target), tokenizer_of(files.target), PROPOSERS[proposer](files),
                        Sampling(**{"max_new_tokens": 16} | sampling))


def cold(files: Files, prompt: list[int], proposer: str = "draft", **sampling) -> list[int]:
    """specdec.generate's answer to `prompt` on freshly loaded models (nothing cached)."""
    options = {"max_new_tokens": 16} | sampling
    return generate(load_gguf(files.target), prompt, drafter=PROPOSERS[proposer](files), **options).new_tokens


@pytest.mark.parametrize("proposer, sampling", [("none", {}), ("draft", {}), ("lookup", {}), ("hybrid", {}),
                                                ("draft", {"temperature": 0.8, "seed": 5})])
def test_each_answer_equals_a_cold_generation_of_the_whole_conversation(files, proposer, sampling):
    talk = conversation(files, proposer, **sampling)
    before = 0
    for i, message in enumerate(MESSAGES):
        prompt = talk.prompt(message)
        turn = talk.say(message)
        assert turn.result.new_tokens == cold(files, prompt, proposer, **sampling), (proposer, i)
        if not sampling:
            assert turn.result.new_tokens == cold(files, prompt, "none"), (proposer, i)
        assert turn.prompt_tokens == len(prompt)
        assert turn.cached_tokens >= before  # the whole previous prompt came from the cache
        assert (turn.cached_tokens > 0) == (i > 0)
        before = len(prompt)
    assert [m["role"] for m in talk.messages] == ["user", "assistant"] * 3
    assert [m["content"] for m in talk.messages[::2]] == MESSAGES


def count_rows(lm, into: list[int]) -> None:
    """Append the rows of each of `lm`'s decoder forwards to `into`."""
    forward = lm.decoder.forward

    def counted(rows):
        into.append(rows.tokens.numel())
        return forward(rows)

    lm.decoder.forward = counted


def test_a_follow_up_turn_forwards_only_the_tokens_its_caches_lack(files):
    talk = conversation(files, "draft")
    models = {"target": talk.lm, "draft": talk.proposer.draft_lm}
    rows = {name: [] for name in models}
    for name, lm in models.items():
        count_rows(lm, rows[name])
    first = talk.prompt(MESSAGES[0])
    sequence = first + talk.say(MESSAGES[0]).result.new_tokens
    assert rows["target"][0] == rows["draft"][0] == len(first)  # nothing cached yet: the whole prompt
    held = {name: torch.tensor(sequence[: lm.length]) for name, lm in models.items()}
    for counts in rows.values():
        counts.clear()
    second = talk.prompt(MESSAGES[1])
    turn = talk.say(MESSAGES[1])
    for name in models:
        kept = shared_prefix(held[name], torch.tensor(second[:-1]))
        assert kept >= len(first), name
        assert rows[name][0] == len(second) - kept, name  # the prefill: the new tokens only
    assert turn.cached_tokens == shared_prefix(held["target"], torch.tensor(second[:-1]))
    talk.reset()
    for counts in rows.values():
        counts.clear()
    third = talk.prompt(MESSAGES[2])
    talk.say(MESSAGES[2])
    assert rows["target"][0] == rows["draft"][0] == len(third)


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_the_turn_and_the_conversation_goes_on(files, monkeypatch, capsys, presses):
    """SIGINT sent from the commit callback of the turn's first round after its first token: one
    press stops the turn after that round (its tokens shown and kept); two raise at once (its
    tokens kept, committed before the press, though not shown)."""
    talk = conversation(files, "draft", max_new_tokens=200)
    handler = signal.getsignal(signal.SIGINT)
    shown = Streamer.on_commit
    committed: list[int] = []

    def pressing(self, tokens, from_draft):
        committed.extend(tokens)
        if len(committed) > 1 and not pressing.done:
            pressing.done = True
            for _ in range(presses):
                os.kill(os.getpid(), signal.SIGINT)
        return shown(self, tokens, from_draft)

    pressing.done = False
    monkeypatch.setattr(Streamer, "on_commit", pressing)
    answer(talk, MESSAGES[0], color=False)
    err = capsys.readouterr().err
    assert len(committed) < 200
    assert talk.messages[1] == {"role": "assistant",
                                "content": talk.tokenizer.decode(committed, skip_special_tokens=True)}
    assert ("(stopped)" in err) == (presses == 1) and ("partial answer" in err) == (presses == 2)
    monkeypatch.setattr(Streamer, "on_commit", shown)
    prompt = talk.prompt(MESSAGES[1])
    turn = talk.say(MESSAGES[1])
    assert turn.result.new_tokens == cold(files, prompt, max_new_tokens=200)
    assert (turn.cached_tokens == 0) == (presses == 2)
    assert signal.getsignal(signal.SIGINT) is handler  # the handler before, restored


def test_a_conversation_that_reaches_the_context_is_cut_then_refused(files):
    talk = conversation(files, "draft", max_new_tokens=64)
    fewer, more = 1, CONTEXT  # the most words whose prompt leaves 12 or more positions: bisected
    while fewer < more:
        words = (fewer + more + 1) // 2
        fewer, more = (words, more) if len(talk.prompt("hello " * words)) <= CONTEXT - 12 else (fewer, words - 1)
    words = fewer
    prompt = talk.prompt("hello " * words)
    assert CONTEXT - 20 < len(prompt) <= CONTEXT - 12
    turn = talk.say("hello " * words)
    assert turn.result.finish_reason == "length" and len(turn.result.new_tokens) == CONTEXT - len(prompt)
    with pytest.raises(SpecdecError, match=r"the conversation has \d+ tokens, the model's context 2048: /reset"):
        talk.say("and more")
    assert len(talk.messages) == 2


def test_a_message_of_several_lines_goes_between_fences(monkeypatch):
    lines = iter(['"""def f():', "    return 1", '"""', '"""one line"""', "plain"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert read_message("> ") == "def f():\n    return 1"
    assert read_message("> ") == "one line"
    assert read_message("> ") == "plain"


class Terminal:
    """A command in a pseudo-terminal, as a person's shell runs it (the terminal is its
    controlling one: Ctrl-C typed there is SIGINT), its output read as it comes."""

    ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|[()][0-9A-B]|[=>])")

    def __init__(self, argv: list[str], env: dict, sigint: signal.Handlers = signal.SIG_DFL):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the command, nothing else (SIGINT as `sigint` says, as a launcher sets it)
            signal.signal(signal.SIGINT, sigint)
            os.execve(argv[0], argv, env)
        self._decode = codecs.getincrementaldecoder("utf-8")("replace")
        self.raw, self.seen = "", 0

    @property
    def text(self) -> str:
        """What the terminal shows, without escape sequences and carriage returns."""
        return self.ANSI.sub("", self.raw).replace("\r", "")

    def expect(self, pattern: str, timeout: float = 180) -> re.Match:
        """The next match of `pattern` after the last one, waiting for output up to `timeout` s."""
        deadline = time.monotonic() + timeout
        while not (found := re.compile(pattern).search(self.text, self.seen)):
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"no {pattern!r} on the terminal, which shows:\n{self.text}")
        self.seen = found.end()
        return found

    def send(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def wait_for_a_key(self, timeout: float = 60) -> None:
        """Until the command's main thread blocks waiting for the terminal (readline's pselect6 or
        a read), rather than a fixed sleep after the prompt shows."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            call = Path(f"/proc/{self.pid}/syscall").read_text().split()[0]
            if call in {"0", "7", "23", "270", "271"}:  # read, poll, select, pselect6, ppoll
                return
            time.sleep(0.05)
        raise AssertionError(f"the command never waited for a key in {timeout} s:\n{self.text}")

    def status(self, timeout: float = 60) -> int:
        """The command's exit status, once it exits (killed after `timeout` s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read(0.2)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"still running after {timeout} s; the terminal shows:\n{self.text}")

    def _read(self, timeout: float) -> bool:
        """Read what is there within `timeout` s; False once the command's side is closed."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return True
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: the command exited and closed the terminal
            return False
        self.raw += self._decode.decode(chunk)
        return bool(chunk)


def chat_terminal(files: Files, *flags: str, sigint: signal.Handlers = signal.SIG_DFL) -> Terminal:
    argv = [sys.executable, "-m", "specdec.cli", "chat", "--target", files.target, "--draft", files.draft,
            "--runtime", "native", "--proposer", "draft:k=3", *flags]
    return Terminal(argv, {**os.environ, "SPECDEC_CACHE": str(Path(files.folder) / "cache"), "TERM": "xterm"},
                    sigint)


SPEED = r"\[specdec\] (\d+) tokens[^,\n]*, [\d.]+ tok/s(?:, accepted length [\d.]+)?, first token [\d.]+ s, " \
        r"prompt (\d+) tokens, (\d+) from the cache"


def shown(text: str) -> str:
    """An answer as the terminal shows it, up to its first character that is not printable (the
    tiny models' answers are random tokens: control bytes, pieces of characters)."""
    return re.split(r"[^\w\s!-/:-@\[-`{-~]|[\r\x0b\x0c]", text, maxsplit=1)[0].strip()


def test_three_turns_reset_and_end_of_input_in_a_terminal(files):
    reference = conversation(files, "draft", max_new_tokens=24)
    expected = [reference.say(MESSAGES[0]), reference.say(MESSAGES[1])]
    reference.reset()
    expected.append(reference.say(MESSAGES[2]))
    assert all(len(shown(turn.text)) >= 8 for turn in expected), expected  # enough of each answer to recognise it

    term = chat_terminal(files, "--max-new-tokens", "24", "--color", "always")
    term.expect(r"\[specdec\] chat: /reset forgets")
    cached = []
    for i, message in enumerate(MESSAGES):
        if i == 2:
            term.expect("> ")
            term.send("/reset\r")
            term.expect("the conversation is forgotten")
        term.expect("> ")
        term.send(message + "\r")
        term.expect(re.escape(message) + "\n")
        answer_text = term.expect(r"(?s).*?(?=\[specdec\] \d+ tokens)", timeout=120).group(0)
        assert shown(expected[i].text) in answer_text, (expected[i].text, answer_text)
        speed = term.expect(SPEED)
        assert int(speed.group(1)) == len(expected[i].result.new_tokens)
        cached.append(int(speed.group(3)))
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0  # the second turn reused; /reset forgot
    assert "\x1b[32m" in term.raw  # guessed tokens coloured
    term.expect("> ")
    term.send("\x04")  # Ctrl-D: end of input
    assert term.status() == 0


def test_ctrl_c_in_a_terminal_stops_the_answer_not_the_program(files):
    term = chat_terminal(files, "--max-new-tokens", str(CONTEXT - 100), "--color", "never")
    term.expect("> ")
    term.send(MESSAGES[0] + "\r")
    term.expect(re.escape(MESSAGES[0]) + "\n.")  # the answer has begun
    term.send("\x03")  # Ctrl-C
    stopped = term.expect(SPEED, timeout=120)
    assert "(stopped)" in stopped.group(0) and int(stopped.group(1)) < CONTEXT - 100
    term.expect("> ")
    term.send(MESSAGES[1] + "\r")
    term.expect(re.escape(MESSAGES[1]) + "\n.")
    term.send("\x03")
    later = term.expect(SPEED, timeout=120)
    assert int(later.group(3)) > 0  # the stopped turn's cache was kept
    term.expect("> ")
    # Python's readline sees a signal only when it interrupts its wait for a key: one that comes
    # before the wait begins (just after the prompt shows) is read with the next key.
    term.wait_for_a_key()
    term.send("\x03")  # at the prompt: a hint, the program goes on
    term.expect("Ctrl-C again")
    term.wait_for_a_key()
    term.send("\x03")
    assert term.status() == 0


def test_ctrl_c_works_at_the_prompt_where_the_chat_started_with_sigint_ignored(files):
    """A launcher (or a test runner's worker) may start the chat with SIGINT ignored, which Python
    keeps: the answers' own handler still stopped them, but at the prompt Ctrl-C did nothing (the
    cause of test_ctrl_c_in_a_terminal_stops_the_answer_not_the_program's failures in full runs)."""
    term = chat_terminal(files, "--color", "never", sigint=signal.SIG_IGN)
    term.expect("> ")
    term.wait_for_a_key()
    term.send("\x03")
    term.expect("Ctrl-C again", timeout=30)
    term.wait_for_a_key()
    term.send("\x03")
    assert term.status() == 0

