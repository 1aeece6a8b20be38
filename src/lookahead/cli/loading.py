"""Running a subcommand: loading its model as the flags say, turning errors into argparse
errors, and the one-line summary of a generation.

    set_handler(parser, run)                 # run(args) -> exit code

    def run(args):
        model, tokenizer, options = load(args)
        result = lookahead.generate(model, input_ids, args.max_new_tokens, args.method, **options)
"""

from __future__ import annotations

import argparse
from typing import Any, NamedTuple

import torch

from lookahead.proposers.draft import check_draft_model
from lookahead.argtypes import UsageError
from lookahead.cli.options import method_options
from lookahead.kernels import Kernel, packing
from lookahead.devices import resolve_device
from lookahead.models.load import load_model
from lookahead.models.registry import ModelNotAvailableError, resolve_dtype
from lookahead.sources.datastore import load_datastore
from lookahead.stats import GenerationStats


class Loaded(NamedTuple):
    """The model, its tokenizer and the keyword options for ``lookahead.generate``/``stream``."""

    model: Any
    tokenizer: Any
    options: dict[str, Any]


def load(args: argparse.Namespace) -> Loaded:
    """Check the options, apply ``--threads`` and load ``--model`` (and ``--draft-model``).

    The options are checked before any model is loaded, so a typo fails at once.
    """
    has_method = hasattr(args, "method")
    if has_method:
        method_options(args)  # fail fast, before the slow part
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if not getattr(args, "verbose", 0):
        quiet_loading_bars()
    packed = getattr(args, "packed_weights", Kernel.PLAIN)
    device = device_arg(args)
    dequantize = getattr(args, "dequantize", False)
    model, tokenizer = load_named("--model", args.model, args.dtype, packed, device, dequantize)
    draft = None
    if has_method and args.method == "draft":
        draft, _ = load_named("--draft-model", args.draft_model, args.dtype, packed, device,
                              dequantize)
        try:
            check_draft_model(model, draft)
        except ValueError as error:
            raise UsageError("--draft-model", str(error)) from None
    options = method_options(args, draft) if has_method else {}
    if getattr(args, "datastore", None):
        try:  # read-only: one corpus serves every request of the process
            options["datastore"] = load_datastore(args.datastore, tokenizer)
        except (ValueError, FileNotFoundError) as error:
            raise UsageError("--datastore", str(error)) from None
    return Loaded(model, tokenizer, options)


def quiet_loading_bars() -> None:
    """Turn off transformers' per-tensor bar of a load (a second for a small model: only
    noise) but keep huggingface_hub's download bars, which transformers' switch turns off
    too: a first download of a hub model takes minutes, and its bar shows them pass. Bars the
    hub had off already (``HF_HUB_DISABLE_PROGRESS_BARS=1``) stay off."""
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    hub_bars = not are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()
    if hub_bars:
        enable_progress_bars()


def device_arg(args: argparse.Namespace) -> Any:
    """``--device`` as a ``torch.device`` (None: not given); a device this machine lacks is a
    ``UsageError`` naming the flag, before any model loads."""
    try:
        return resolve_device(getattr(args, "device", None), "--device")
    except ValueError as error:
        raise UsageError("--device", str(error).removeprefix("--device ")) from None


def load_named(option: str, name: str, dtype: str, packed: Kernel | None = Kernel.PLAIN,
               device: Any = None, dequantize: bool = False) -> tuple[Any, Any]:
    """``lookahead.load_model(name, dtype, device=device)``; an unknown name or path is a
    ``UsageError``.

    ``packed``: the kernel the flags ask for (``args.packed_weights``): ``PACKED``
    (``--packed-weights``), ``STREAM`` (``--stream-kernel``), ``PLAIN`` (not packed), or None
    (the CLI's default: packed where the model allows it). A GGUF model stays quantized unless
    ``dequantize`` (``--dequantize``) or a packing kernel (packing is for de-quantised
    weights) says otherwise.
    """
    quantized = False if dequantize or (packed is not None and packed.packs) else None
    try:
        model, tokenizer = load_model(name, dtype=dtype, device=device, quantized=quantized)
    except ModelNotAvailableError:
        raise
    except (ValueError, FileNotFoundError) as error:
        raise UsageError(option, str(error)) from None
    apply_packing(model, packed)
    return model, tokenizer


def apply_packing(model: Any, packed: Kernel | None) -> Kernel:
    """``lookahead.kernels.packing.apply_packing``; a model that cannot be packed when
    ``--packed-weights`` (or ``--stream-kernel``) asks for it is a ``UsageError`` naming the
    flag."""
    asked = packed is not None and packed.packs
    problem = packing.packing_problem(model, packed) if asked else None
    if problem is not None:
        raise UsageError(packing_flag(packed), problem)
    return packing.apply_packing(model, packed)


def packing_flag(packed: Kernel | None) -> str:
    """The flag that asked for ``packed`` (``args.packed_weights``)."""
    return "--stream-kernel" if packed is Kernel.STREAM else "--packed-weights"


def check_packing_dtype(args: argparse.Namespace) -> None:
    """``packing.check_packable_dtype`` on ``args.packed_weights`` and ``args.dtype``, before
    any model loads (``bench``, ``tune``); raises ValueError naming the flag that asked."""
    try:
        packing.check_packable_dtype(args.packed_weights, resolve_dtype(args.dtype))
    except ValueError as error:
        raise ValueError(f"argument {packing_flag(args.packed_weights)}: {error}") from None


def encode_text(tokenizer: Any, text: str) -> torch.Tensor:
    """Plain text (no chat template) → LongTensor [1, L], with the tokenizer's special tokens."""
    return tokenizer(text, return_tensors="pt")["input_ids"]


def stats_line(stats: GenerationStats) -> str:
    """One line: tokens, seconds, tokens/s and tokens per step (forward pass)."""
    return (
        f"{stats.new_tokens} tokens, {stats.seconds:.2f} s, "
        f"{stats.tokens_per_second:.1f} tokens/s, {stats.tokens_per_step:.2f} tokens/step"
    )
