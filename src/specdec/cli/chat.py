"""`specdec chat`: a conversation in the terminal, decoded speculatively, the target's and the
draft's K/V caches kept between turns (cli.conversation) so a follow-up turn prefills only its
new tokens."""

from __future__ import annotations

import argparse
import re
import signal
import sys
from contextlib import suppress
from typing import TYPE_CHECKING

from ..errors import SpecdecError
from ..load.loaded import load
from ..methods.spec import in_conversation
from .args import method_of, spec_of
from .flags import add_method_args, add_model_args, add_sampling_args
from .options import at_least_one, check_sampling

if TYPE_CHECKING:
    from .conversation import Conversation, Turn

HELP = ('/reset forgets the conversation, /quit or Ctrl-D exits, Ctrl-C stops an answer; a message of '
        'several lines goes between """ and """')
COMMAND = re.compile(r"/\w+")  # a line that is one slash word is a command, not a message
FENCE = '"""'


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("chat", help="a conversation in the terminal, speculatively, the cache kept between turns",
                       description=f"A conversation in the terminal. {HELP}.")
    add_model_args(c)
    add_method_args(c, default="auto")
    add_sampling_args(c)
    c.set_defaults(max_new_tokens=512)  # an answer, not a completion's few lines
    c.add_argument("--system", metavar="TEXT", help="a system message that opens the conversation (default: the "
                                                    "chat template's own, if it has one)")
    c.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="green: tokens the proposer guessed; plain: tokens from the target")
    c.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    from ..prompts.chat import has_chat_template
    from .conversation import Conversation, Sampling

    at_least_one(args, "max_new_tokens")
    check_sampling(args)  # every option before a model loads: a bad value is the only line printed
    if args.system is not None and not args.system.strip():
        raise SpecdecError("--system is empty: give the system message's text, or leave the flag out")
    loaded = load(spec_of(args, in_conversation(method_of(args)), args.pay_rule))
    if not has_chat_template(loaded.tokenizer):
        raise SpecdecError(f"{args.target} has no chat template, which a conversation needs: use an instruct "
                           "model, or `specdec generate --raw` to complete text")
    sampling = Sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.min_p, args.seed)
    talk = Conversation(loaded.lm(), loaded.tokenizer, loaded.proposer, sampling, args.system)
    interactive = sys.stdin.isatty()
    if interactive:
        with suppress(ImportError):  # line editing and history for input(), where Python has readline
            import readline  # noqa: F401
        # Ctrl-C is the chat's key even where it started with SIGINT ignored (a launcher's or a test
        # runner's choice, which Python keeps): answers installed their own handler and stopped,
        # while at the prompt the key did nothing.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"[specdec] chat: {HELP}", file=sys.stderr, flush=True)
    return chat(talk, color=args.color == "always" or (args.color == "auto" and sys.stdout.isatty()),
                prompt="> " if interactive else "")


def chat(talk: Conversation, color: bool, prompt: str) -> int:
    """Read messages and commands until /quit, end of input or two Ctrl-C in a row at the prompt."""
    armed = False  # the last key at the prompt was Ctrl-C: another one exits
    while True:
        try:
            text = read_message(prompt)
        except EOFError:
            print(flush=True)
            return 0
        except KeyboardInterrupt:
            if armed:
                print(flush=True)
                return 0
            armed = True
            _note("\n[specdec] Ctrl-C again, /quit or Ctrl-D exits")
            continue
        armed = False
        line = text.strip()
        if COMMAND.fullmatch(line):
            if line == "/quit":
                return 0
            _command(talk, line)
        elif line:
            answer(talk, text, color)


def _command(talk: Conversation, line: str) -> None:
    if line == "/reset":
        talk.reset()
        _note("[specdec] the conversation is forgotten")
    else:
        _note(f"[specdec] {HELP}")


def read_message(prompt: str) -> str:
    """One line, or the lines between a line that starts with \"\"\" and one that ends with it."""
    line = input(prompt)
    if not line.lstrip().startswith(FENCE):
        return line
    rest, lines = line.lstrip()[len(FENCE):], []
    while not rest.rstrip().endswith(FENCE):
        lines.append(rest)
        rest = input("... " if prompt else "")
    lines.append(rest.rstrip()[: -len(FENCE)])
    return "\n".join(lines).strip("\n")


def answer(talk: Conversation, text: str, color: bool) -> None:
    """One turn, streamed to stdout, its speed on stderr; Ctrl-C stops it (StopKey)."""
    from ..decode.engine import GenerationInterrupted
    from .stream import Streamer

    streamer = Streamer(talk.tokenizer, color=color)
    with StopKey() as key:
        try:
            turn = talk.say(text, lambda tokens, from_draft: streamer.on_commit(tokens, from_draft) or key.pressed)
        except GenerationInterrupted:
            streamer.finish()
            _note("[specdec] stopped: the partial answer stays in the conversation; the next turn prefills it "
                  "from the start")
            return
        except KeyboardInterrupt:
            _note("\n[specdec] stopped before the first token: the message is dropped")
            return
        except SpecdecError as e:
            streamer.finish()
            _note(f"specdec: error: {e}")
            return
        streamer.finish()
        _note(speed_line(turn))


def speed_line(turn: Turn) -> str:
    """The turn on one line: tokens, decode speed, tokens per target call, time to first token,
    and how much of the prompt came from the cache."""
    s = turn.result.stats
    ended = {"length": " (cut at --max-new-tokens)", "stopped": " (stopped)"}.get(turn.result.finish_reason, "")
    parts = [f"{s.new_tokens} tokens{ended}", f"{s.tokens_per_s:.1f} tok/s"]
    if s.proposed:
        parts.append(f"accepted length {s.mean_accepted_length:.2f}")
    if turn.first_token_s is not None:
        parts.append(f"first token {turn.first_token_s:.2f} s")
    parts.append(f"prompt {turn.prompt_tokens} tokens, {turn.cached_tokens} from the cache")
    return "[specdec] " + ", ".join(parts)


class StopKey:
    """Ctrl-C while an answer runs: the first press asks the turn to stop after the round in
    flight (`pressed`, which the commit callback returns), leaving the caches as any answer
    does; a second raises KeyboardInterrupt where the program is (the next turn then prefills
    from nothing). The handler before is restored on exit."""

    def __enter__(self) -> StopKey:
        self.pressed = False
        self._before = signal.signal(signal.SIGINT, self._press)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self._before)

    def _press(self, signum, frame) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True


def _note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
