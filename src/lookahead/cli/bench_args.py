"""Argument helpers shared by ``lookahead bench`` and ``lookahead tune`` (on top of
``lookahead.cli.options``, which every subcommand shares).

Parse-time validation lives in ``type=`` functions so that a bad value is reported by argparse
itself (``lookahead bench: error: argument --methods: ...``, exit status 2).
"""

from __future__ import annotations

import argparse
import logging

import torch

from lookahead.cli.options import (DTYPE_HELP, WINDOW_HELP, add_config_flags, add_kernel_args,
                                   add_model_args, dtype_name, workload_arg)
from lookahead.config import LookaheadConfig, check_ranges
from lookahead.models.registry import AUTO_DTYPE, resolve_dtype
from lookahead.kernels.choice import Kernel
from lookahead.kernels.packing import resolve_kernel
from lookahead.models.load import loads_quantized

logger = logging.getLogger(__name__)


def comma_list(choices: tuple[str, ...] | None = None):
    """An argparse ``type`` for "a,b,c" -> ("a", "b", "c"), each in ``choices`` if given."""

    def parse(text: str) -> tuple[str, ...]:
        items = tuple(item.strip() for item in text.split(",") if item.strip())
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list, got nothing")
        if choices is not None:
            unknown = [item for item in items if item not in choices]
            if unknown:
                raise argparse.ArgumentTypeError(
                    f"unknown {', '.join(map(repr, unknown))}; choose from {', '.join(choices)}"
                )
        if len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"{text!r} names an item twice")
        return items

    return parse


def dtype_list(text: str) -> tuple[str, ...]:
    """An argparse ``type``: "fp32,bf16" -> ("float32", "bfloat16"); "none" -> ()."""
    if text.strip().lower() == "none":
        return ()
    names = tuple(dtype_name(item) for item in comma_list()(text))
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r} names a dtype twice")
    return names


def positive_int(text: str) -> int:
    """An argparse ``type``: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_int_list(text: str) -> tuple[int, ...]:
    """An argparse ``type``: "1,2,4" -> (1, 2, 4), each a positive integer."""
    return tuple(positive_int(item) for item in comma_list()(text))


def shape_arg(text: str) -> str | tuple[int, int, int]:
    """An argparse ``type`` for ``--shape``: "auto" or "WxNxG" (e.g. "7x5x7")."""
    if text.strip().lower() == "auto":
        return "auto"
    parts = text.lower().replace(",", "x").split("x")
    try:
        window, ngram, guess = (int(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--shape is 'auto' or WINDOWxNGRAMxGUESS such as 7x5x7, got {text!r}"
        ) from None
    try:  # the ranges of LookaheadConfig's fields
        check_ranges(LookaheadConfig(window=window, ngram=ngram, guess=guess))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return window, ngram, guess


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --dtype, --threads (the shared ones of ``lookahead.cli.options``) and
    --cache-dir."""
    add_model_args(parser)
    parser.add_argument("--cache-dir", help="cache root (default ~/.cache/lookahead)")


def add_comparison_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of the scripts in ``benchmarks/`` that compare runs prompt by prompt:
    --model, --dtype, --datasets, --limit, --max-new-tokens, --threads, --[no-]packed-weights,
    --stream-kernel."""
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", type=dtype_name, default=AUTO_DTYPE, help=DTYPE_HELP)
    parser.add_argument("--datasets", type=comma_list(), default=("humaneval", "mtbench", "gsm8k"))
    parser.add_argument("--limit", type=positive_int, default=5, help="prompts per data set")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256)
    parser.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    add_kernel_args(parser)


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """--shape auto|WxNxG and --window/--ngram/--guess (which override parts of --shape)."""
    parser.add_argument(
        "--shape",
        type=shape_arg,
        help=f"{WINDOW_HELP.removeprefix('lookahead: window size, or ')}; or "
        "WINDOWxNGRAMxGUESS, e.g. 7x5x7",
    )
    add_config_flags(parser, names=("window", "ngram", "guess", "lookup_tokens", "recycle"),
                     methods=("lookahead",))
    parser.add_argument("--workload", type=workload_arg, metavar="NAME",
                        help="with --shape auto: the shape `lookahead tune --workload NAME` "
                        "saved (e.g. code), else the general tuned one")


def shape_from_args(args: argparse.Namespace) -> tuple[dict[str, int], str]:
    """The lookahead shape asked for: --shape (auto, the default: the saved profile), then
    --window etc. and --lookup-tokens; and where it came from.

    Returns ``dict(window=, ngram=, guess=)`` (and ``lookup_tokens`` when the saved profile or
    --lookup-tokens gives one), validated later by ``LookaheadConfig``, and the profile's path,
    "default" (no profile saved) or "given" (--shape WxNxG or --window).
    """
    from lookahead.profiles import find_shape

    if args.shape in (None, "auto"):
        dtype, packed = args.dtype, resolve_kernel(resolve_dtype(args.dtype), args.packed_weights)
        if not getattr(args, "dequantize", False) and loads_quantized(
                args.model, args.dtype, args.packed_weights, getattr(args, "device", None)):
            dtype, packed = "float32", Kernel.QUANTIZED  # the profile `tune` saves for it
        shape, source = find_shape(args.model, dtype, cache_dir=args.cache_dir,
                                   workload=args.workload, packed=packed)
    elif args.workload is not None:
        raise ValueError(
            "--workload chooses a tuned shape; it cannot go with --shape "
            + "x".join(map(str, args.shape))
        )
    else:
        shape, source = dict(zip(("window", "ngram", "guess"), args.shape, strict=True)), "given"
    for name in ("window", "ngram", "guess", "lookup_tokens", "recycle"):
        if getattr(args, name, None) is not None:
            shape[name] = getattr(args, name)
    return shape, "given" if getattr(args, "window", None) is not None else source


def apply_threads(threads: int | None) -> None:
    """Set torch's intra-op threads (CLI and scripts only: the library never does)."""
    if threads is not None:
        torch.set_num_threads(threads)
    logger.info("torch uses %d threads", torch.get_num_threads())


def quiet_loading(args: argparse.Namespace) -> None:
    """Hide transformers' per-tensor loading bars unless -v: our progress bar says enough."""
    if not getattr(args, "verbose", 0):
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
