"""``lookahead demo``: the same prompt decoded by ``model.generate`` and by lookahead decoding.

Prints both speeds, the speed-up, tokens per forward pass and whether the two outputs are
identical (greedy decoding: they should be, token for token).
"""

from __future__ import annotations

import argparse
import time

import torch
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

import lookahead
from lookahead.cli.loading import encode_text, load
from lookahead.cli.options import set_handler
from lookahead.cli.options import WINDOW_HELP, add_max_new_tokens, add_model_args, window_arg
from lookahead.argtypes import int_in
from lookahead.config import MAX_GUESS, MAX_NGRAM
from lookahead.models.registry import resolve_dtype
from lookahead.kernels.packing import is_packed

# The start of a small Python class, to be continued: code repeats names and whole phrases
# ("self.x", "other.x", a sibling class), which is where the n-gram pool of lookahead decoding
# pays off. (An instruction-tuned model given a bare HumanEval header tends to close the code
# block after a few lines and then explain it in prose.)
DEFAULT_PROMPT = '''class Vector:
    """A 3-dimensional vector."""

    def __init__(self, x: float, y: float, z: float):
        self.x = x
        self.y = y
        self.z = z

    def __add__(self, other: "Vector") -> "Vector":
        return Vector(self.x + other.x, self.y + other.y, self.z + other.z)

'''
WARMUP_TOKENS = 8


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        description="Decode one prompt greedily with Hugging Face's model.generate and with "
        "lookahead decoding; print both speeds and check that the outputs are identical.",
    )
    add_model_args(parser)
    add_max_new_tokens(parser, default=256)
    parser.add_argument(
        "--prompt",
        metavar="TEXT",
        default=DEFAULT_PROMPT,
        help="text to continue (default: the start of a small Python class)",
    )
    shape = parser.add_argument_group("lookahead shape")
    shape.add_argument("--window", type=window_arg, default="auto", metavar="W", help=WINDOW_HELP)
    shape.add_argument("--ngram", type=int_in(2, MAX_NGRAM), metavar="N")
    shape.add_argument("--guess", type=int_in(1, MAX_GUESS), metavar="G")
    set_handler(parser, run)


def run(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    with console.status(f"loading {args.model} ..."):
        model, tokenizer, _ = load(args)
    input_ids = encode_text(tokenizer, args.prompt)
    shape = {k: getattr(args, k) for k in ("window", "ngram", "guess") if getattr(args, k)}

    pad_token_id = model.generation_config.pad_token_id
    if pad_token_id is None:  # silences model.generate's warning; batch 1 has no padding
        pad_token_id = tokenizer.eos_token_id

    def hf_generate(max_new_tokens: int) -> list[int]:
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad_token_id,
        )
        return output[0, input_ids.shape[1] :].tolist()

    def lookahead_generate(max_new_tokens: int) -> lookahead.GenerationResult:
        return lookahead.generate(model, input_ids, max_new_tokens, "lookahead",
                                  do_sample=False, **shape)  # greedy, as the reference

    with console.status("warming up ..."):
        hf_generate(WARMUP_TOKENS)
        lookahead_generate(WARMUP_TOKENS)
    with console.status(f"model.generate: {args.max_new_tokens} tokens ..."):
        started = time.perf_counter()
        reference = hf_generate(args.max_new_tokens)
        hf_seconds = time.perf_counter() - started
    with console.status(f"lookahead: {args.max_new_tokens} tokens ..."):
        started = time.perf_counter()
        result = lookahead_generate(args.max_new_tokens)
        seconds = time.perf_counter() - started  # timed as model.generate is: the whole call
    ours = result.new_tokens[0].tolist()

    setting = (args.model, weights_of(model), is_packed(model))
    report(console, setting, (reference, hf_seconds), (result, seconds))
    console.print(
        Panel(tokenizer.decode(ours, skip_special_tokens=True), title="generated"), markup=False
    )
    return 0


def weights_of(model) -> str:
    """How the model's weights are held: "quantized Q4_1 (GGUF blocks, integer kernel),
    float32" on the quantized path, else the dtype."""
    from lookahead.kernels.quant_formats import FORMATS
    from lookahead.kernels.quant_linear import QuantLinear

    types = sorted({FORMATS[m.qtype].name for m in model.modules() if isinstance(m, QuantLinear)})
    dtype = str(model.dtype).removeprefix("torch.")
    if not types:
        return dtype
    return f"quantized {'/'.join(types)}: GGUF blocks on the integer kernel, {dtype} elsewhere"


def report(console: Console, setting: tuple[str, str, bool], hf: tuple[list[int], float],
           ours: tuple) -> None:
    """The speed table, the speed-up and the exactness check.

    ``setting``: the model's name, dtype and whether its weights are packed (both decoders
    run on the same model); ``hf``: model.generate's new tokens and seconds; ``ours``:
    lookahead's result and seconds.
    """
    reference, hf_seconds = hf
    result, seconds = ours
    stats, tokens = result.stats, result.new_tokens[0].tolist()
    hf_speed, speed = len(reference) / hf_seconds, len(tokens) / seconds
    name, dtype, packed = setting
    weights = f"{dtype}, packed weights" if packed else dtype
    table = Table(title=f"{name} ({weights}), {stats.prompt_tokens}-token prompt")
    for column in ("decoding", "tokens", "seconds", "tokens/s", "tokens/step"):
        table.add_column(column, justify="left" if column == "decoding" else "right")
    table.add_row(
        "model.generate (greedy)",
        str(len(reference)),
        f"{hf_seconds:.2f}",
        f"{hf_speed:.1f}",
        "1.00",
    )
    table.add_row(
        "lookahead.generate",
        str(len(tokens)),
        f"{seconds:.2f}",
        f"{speed:.1f}",
        f"{stats.tokens_per_step:.2f}",
    )
    console.print(table)
    console.print(f"speed-up: [bold]{speed / hf_speed:.2f}x[/]")
    if tokens == reference:
        console.print(f"outputs: [bold green]identical[/] ({len(tokens)} tokens)")
        return
    first = next(
        (i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b),
        min(len(tokens), len(reference)),
    )
    console.print(
        f"outputs: [bold red]DIFFERENT[/] from token {first} "
        f"(lookahead {len(tokens)} tokens, model.generate {len(reference)})"
    )
    if resolve_dtype(dtype) in (torch.bfloat16, torch.float16):
        console.print(
            f"[dim]In {dtype}, a forward pass over several tokens rounds differently from "
            "model.generate's one-token passes, so a near-tie between two tokens can go the "
            "other way; with --dtype float32 this is far rarer.[/]"
        )
