"""``lookahead generate``: complete one prompt, printing the text as it is decoded.

lookahead generate --model smollm2-135m "def fibonacci(n):"
echo "Explain KV caches." | lookahead generate --chat --stats -
"""

from __future__ import annotations

import argparse
import json
import sys

import lookahead
from lookahead.argtypes import UsageError
from lookahead.cli.chat import ctrl_c_requests_stop
from lookahead.cli.options import set_handler
from lookahead.cli.options import add_max_new_tokens, add_method_args, add_model_args
from lookahead.detokenize import Detokenizer


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        description="Complete PROMPT and print the new text as it is decoded. Greedy output is "
        "the model's own greedy output, token for token, whatever the method.",
    )
    parser.add_argument("prompt", metavar="PROMPT", help="the prompt text; - reads it from stdin")
    add_model_args(parser, default=None)
    add_method_args(parser)
    add_max_new_tokens(parser, default=256)
    parser.add_argument(
        "--chat",
        action="store_true",
        help="wrap PROMPT in the model's chat template as a user message",
    )
    parser.add_argument(
        "--stats", action="store_true", help="print the generation's statistics as JSON on stderr"
    )
    set_handler(parser, run)


def run(args: argparse.Namespace) -> int:
    # Imported here, after parsing: they load torch and transformers.
    from lookahead.cli.loading import encode_text, load
    from lookahead.models.load import chat_prompt

    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    if args.chat:
        text = text.strip()
    if not text:
        raise UsageError("PROMPT", "is empty")
    model, tokenizer, options = load(args)
    input_ids = chat_prompt(tokenizer, text) if args.chat else encode_text(tokenizer, text)
    if input_ids.shape[1] == 0:
        raise UsageError("PROMPT", "encodes to no tokens")
    try:
        stream = lookahead.stream(model, input_ids, args.max_new_tokens, args.method, **options)
    except ValueError as error:  # e.g. prompt + max_new_tokens beyond the model's context
        raise UsageError("--max-new-tokens", str(error)) from None

    out = sys.stdout
    # The prompt decoded in front: the first word keeps the space it has after it.
    delta = Detokenizer(tokenizer, prompt=input_ids[0].tolist())
    # Ctrl-C sets a flag checked after each step (a second one raises at once): raised at an
    # arbitrary bytecode, a KeyboardInterrupt can land in a finaliser, where Python drops it.
    with ctrl_c_requests_stop() as stop:
        for tokens in stream:
            out.write(delta.push(tokens))
            out.flush()
            if stop.is_set():
                raise KeyboardInterrupt  # cli.main: "interrupted", status 130
    out.write(delta.finish() + "\n")
    out.flush()
    if args.stats:
        print(json.dumps(stream.stats.as_dict()), file=sys.stderr, flush=True)
    return 0
