"""``lookahead chat``: a multi-turn chat in the terminal, each answer streamed as it is decoded.

    lookahead chat --model smollm2-135m --debug
    lookahead chat --model smollm2-135m --method autoregressive --debug    # to compare

``/reset`` clears the conversation; ``/quit`` or Ctrl-D leaves; Ctrl-C stops the answer being
written (Ctrl-C at the prompt leaves). With ``--debug`` the tokens that one forward pass
committed together are shown in blue, and each answer ends with a statistics line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator

from rich.console import Console

import lookahead
from lookahead.cli.options import set_handler
from lookahead.cli.options import add_max_new_tokens, add_method_args, add_model_args
from lookahead.detokenize import Detokenizer

PROMPT = "[bold green]>>>[/] "
# Memory for the conversation's KV entries, kept between turns so that each turn prefills
# only what is new: the template's rendering of the last answer and the new message.
CONVERSATION_CACHE_BYTES = 4 << 30
MULTI_TOKEN_STYLE = "blue"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        description="Chat with a model, using its chat template. /reset clears the conversation, "
        "/quit or Ctrl-D leaves, Ctrl-C stops an answer.",
    )
    add_model_args(parser, default=None)
    add_method_args(parser)
    add_max_new_tokens(parser, default=512, help="longest answer")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show tokens committed several at a time in blue and a statistics line per answer",
    )
    set_handler(parser, run)


def run(args: argparse.Namespace) -> int:
    # Imported here, after parsing: they load torch and transformers.
    from lookahead.cli.loading import load
    from lookahead.models.load import chat_prompt
    from lookahead.config import LookaheadConfig, method_spec
    from lookahead.prefix_cache import PrefixCache
    from lookahead.proposers.recycling import SuccessorTable

    console = Console(highlight=False, soft_wrap=True)
    with console.status(f"loading {args.model} ..."):
        model, tokenizer, options = load(args)
    context = getattr(model.config, "max_position_embeddings", None)
    console.print(
        f"[bold]{args.model}[/], method [bold]{args.method}[/]. "
        "/reset clears the conversation, /quit or Ctrl-D leaves, Ctrl-C stops an answer."
    )
    messages: list[dict[str, str]] = []
    prefixes = PrefixCache(CONVERSATION_CACHE_BYTES)
    recycle = options.get("recycle", LookaheadConfig.recycle)
    if method_spec(args.method).recycles and recycle:
        # the model's own predictions, kept from turn to turn as the conversation's KV is
        options["successors"] = SuccessorTable(recycle)
    while True:
        try:
            text = read_line(console, PROMPT).strip()
        except (EOFError, KeyboardInterrupt):
            console.print()
            return 0
        if text in ("/quit", "/exit"):
            return 0
        if text == "/reset":
            messages.clear()
            prefixes.clear()
            console.print("[dim](conversation cleared)[/]")
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        input_ids = chat_prompt(tokenizer, messages)
        room = args.max_new_tokens if context is None else context - input_ids.shape[1]
        if room < 1:
            messages.pop()
            console.print("[red]The conversation fills the model's context: /reset to go on.[/]")
            continue
        budget = min(args.max_new_tokens, room)
        stream = lookahead.stream(model, input_ids, budget, args.method, **options,
                                  prefix=prefixes.lookup(input_ids[0].tolist()))
        answer = answer_turn(console, tokenizer, stream, debug=args.debug)
        messages.append({"role": "assistant", "content": answer})
        remember(prefixes, stream)


def remember(prefixes, stream) -> None:
    """Keep the KV entries of the text ``stream`` decoded (all but its last token) for the
    next turn, unless Ctrl-C stopped it in the middle of a step."""
    from lookahead.prefix_cache import entries_of

    text = stream.sequences[0].tolist()
    entries = entries_of(stream.past_key_values)
    if len(text) > 1 and entries and entries[0][0].shape[2] == len(text) - 1:
        prefixes.store(text[:-1], entries)


def read_line(console: Console, prompt: str) -> str:
    """``console.input(prompt)``, but a Ctrl-C that comes right after the prompt is not lost.

    ``input()`` blocks in read() just after writing the prompt: a SIGINT that lands in between
    only sets Python's flag, and the read then waits for a line that may never come (a test
    that pressed Ctrl-C as soon as the prompt showed hung on a busy machine). Waiting for the
    terminal with select(), which returns every 0.1 s, runs the handler within that time.
    """
    if os.name != "posix" or not sys.stdin.isatty():
        return console.input(prompt)
    console.print(prompt, end="")
    while not select.select([sys.stdin], [], [], 0.1)[0]:
        pass
    line = sys.stdin.readline()
    if not line:  # Ctrl-D
        raise EOFError
    return line.rstrip("\n")


def answer_turn(console: Console, tokenizer, stream, *, debug: bool) -> str:
    """Print the streamed answer; return its text. Ctrl-C ends the answer early, not the chat."""
    delta = Detokenizer(tokenizer)
    # The suppress catches a second Ctrl-C, for a step that does not end.
    with ctrl_c_requests_stop() as stop, contextlib.suppress(KeyboardInterrupt):
        for tokens in stream:
            style = MULTI_TOKEN_STYLE if debug and len(tokens) > 1 else None
            console.print(delta.push(tokens), style=style, end="", markup=False)
            if stop.is_set():
                break
    if stop.is_set():
        console.print(" [dim](stopped)[/]", end="")
    console.print(delta.finish(), end="\n", markup=False)
    if debug:
        from lookahead.cli.loading import stats_line

        console.print(f"[dim]{stats_line(stream.stats)}[/]")
    return tokenizer.decode(delta.tokens, skip_special_tokens=True)


@contextlib.contextmanager
def ctrl_c_requests_stop() -> Iterator[threading.Event]:
    """While inside, the first Ctrl-C sets the yielded event and the second raises as usual.

    A KeyboardInterrupt raised at an arbitrary bytecode can land in a finaliser, where Python
    prints and drops it, and the answer runs on; a flag checked after each step cannot be lost.
    """
    stop = threading.Event()

    def on_sigint(signum, frame) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
