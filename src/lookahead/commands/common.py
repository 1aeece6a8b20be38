"""What the subcommands share: model, method and sampling options, loading, streamed text.

A subcommand module adds its parser, then::

    add_model_args(parser)                   # --model --dtype --threads --[no-]packed-weights
    add_method_args(parser)                  # --method, each method's shape, --sample ...
    set_handler(parser, run)                 # run(args) -> exit code

    def run(args):
        model, tokenizer, options = load(args)
        result = lookahead.generate(model, input_ids, args.max_new_tokens, args.method, **options)

Bad combinations of options (``--window`` with ``--method prompt_lookup``, ``--temperature``
without ``--sample``, an unknown ``--model``) raise :class:`UsageError`; :func:`set_handler` turns
it into the usual argparse error (usage line, the option's name, exit status 2).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from lookahead import packing
from lookahead.api import METHOD_OPTIONS, check_draft_model
from lookahead.config import (
    MAX_DRAFT_TOKENS,
    MAX_GUESS,
    MAX_NGRAM,
    MAX_WINDOW,
    METHODS,
    check_workload,
)
from lookahead.datastore import check_spec, load_datastore
from lookahead.devices import resolve_device
from lookahead.memory import MEMORY_METHODS
from lookahead.models import (
    AUTO_DTYPE,
    DEFAULT_MODEL,
    ModelNotAvailableError,
    load_model,
    resolve_dtype,
)
from lookahead.models import dtype_name as canonical_dtype_name
from lookahead.stats import GenerationStats

logger = logging.getLogger(__name__)

# The method options the CLI exposes, by the keyword lookahead.generate takes; the flag is
# "--" + name with "-" for "_". (--draft-model is handled apart: it names a model to load.)
_SHAPE_OPTIONS = ("window", "ngram", "guess", "workload", "lookup_tokens", "lookup_max_tokens",
                  "token_cost", "num_draft_tokens", "max_draft_tokens", "max_ngram",
                  "max_step_tokens")
_SAMPLING_OPTIONS = ("temperature", "top_p", "top_k", "seed")


class UsageError(Exception):
    """A bad command line found after parsing; ``option`` is the flag to blame, e.g. "--window"."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"argument {option}: {message}")
        self.option = option


class Loaded(NamedTuple):
    """The model, its tokenizer and the keyword options for ``lookahead.generate``/``stream``."""

    model: Any
    tokenizer: Any
    options: dict[str, Any]


# ----------------------------------------------------------------------------- argument types


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting an int in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {value}")
        return value

    parse.__name__ = "int"
    return parse


def window_arg(text: str) -> int | str:
    """An argparse ``type`` for ``--window``: "auto" (the tuned shape) or an int window."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer, got {text!r}") from None
    return int_in(1, MAX_WINDOW)(text)


WINDOW_HELP = ("lookahead: window size, or 'auto' (the default): the shape `lookahead tune` "
               "saved for this model and machine, else W2 N5 G4")


def workload_arg(text: str) -> str:
    """An argparse ``type`` for ``--workload``: the name of a tuned profile."""
    try:
        return check_workload(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def float_in(low: float, high: float, *, low_open: bool = False,
             high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a number in the interval from ``low`` to ``high`` (ends open or not)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        if not (above and below):
            interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {value}")
        return value

    parse.__name__ = "float"
    return parse


DTYPE_HELP = (
    f"weight dtype: auto, bfloat16, float32, ... (default: auto, bfloat16 where the CPU "
    f"multiplies it natively (AVX512-BF16 or AMX), else float32; here: "
    f"{canonical_dtype_name(AUTO_DTYPE)})"
)


def dtype_name(text: str) -> str:
    """An argparse ``type``: a dtype alias ("bf16") -> its canonical name ("bfloat16"); "auto"
    -> this machine's choice (``lookahead.models.preferred_dtype``)."""
    try:
        return canonical_dtype_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# ----------------------------------------------------------------------------- option groups


def add_model_args(parser: argparse.ArgumentParser, *, default: str | None = DEFAULT_MODEL) -> None:
    """``--model`` (required when ``default`` is None), ``--dtype`` and ``--threads``."""
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        required=default is None,
        default=default,
        metavar="NAME",
        help="a bundled model (see `lookahead install-model -h`), a local Hugging Face folder, "
        "a .gguf file or a hub id" + (f" (default: {default})" if default else ""),
    )
    group.add_argument(
        "--dtype", type=dtype_name, default=AUTO_DTYPE, help=DTYPE_HELP
    )
    group.add_argument(
        "--device", default=None, metavar="DEVICE",
        help="where the model runs: cpu, cuda, cuda:1, mps (default: cpu)",
    )
    group.add_argument(
        "--threads",
        type=int_in(1, 1024),
        default=None,
        metavar="N",
        help="CPU threads for PyTorch (default: PyTorch's choice)",
    )
    group.add_argument(
        "--packed-weights",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="swap the linear layers for faster ones on a CPU: bfloat16 weights laid out once "
        "for oneDNN, the same sums; float32 products taken weight first, sums that differ in "
        "the last bits (default: on for bfloat16 where the CPU can pack it, "
        "off for float32)",
    )
    group.add_argument(
        "--stream-kernel",
        dest="packed_weights",
        action="store_const",
        const=packing.STREAM,
        help="pack bfloat16 linears for the stream kernel (compiled on first use), summed in "
        "float32: sums that differ in the last bits, and passes of up to 8 tokens for about "
        "the cost of one (12 for under 1.5x) on an AVX-512 CPU without AMX",
    )


def add_max_new_tokens(parser: argparse.ArgumentParser, *, default: int, help: str = "") -> None:
    """``--max-new-tokens N`` (an int in [1, 2**20])."""
    parser.add_argument(
        "--max-new-tokens",
        type=int_in(1, 1 << 20),
        default=default,
        metavar="N",
        help=f"{help + ' ' if help else ''}(default: {default})",
    )


def add_method_args(parser: argparse.ArgumentParser, *, default: str = "lookahead") -> None:
    """``--method`` with each method's options, and the sampling options."""
    group = parser.add_argument_group("decoding method")
    group.add_argument("--method", choices=METHODS, default=default, help=f"(default: {default})")
    group.add_argument("--window", type=window_arg, metavar="W", help=WINDOW_HELP)
    group.add_argument(
        "--ngram", type=int_in(2, MAX_NGRAM), metavar="N", help="lookahead: n-gram length"
    )
    group.add_argument(
        "--guess",
        type=int_in(1, MAX_GUESS),
        metavar="G",
        help="lookahead: candidate n-grams verified per step",
    )
    group.add_argument(
        "--workload",
        type=workload_arg,
        metavar="NAME",
        help="lookahead: the shape `lookahead tune --workload NAME` saved for this kind of text "
        "(e.g. code), else the general tuned shape",
    )
    group.add_argument(
        "--lookup-tokens",
        type=int_in(0, MAX_DRAFT_TOKENS),
        metavar="L",
        help="lookahead, draft: length of the continuation copied from earlier text after the "
        "last n-gram (default: 8, or the tuned profile's); draft: 0 turns the copy off",
    )
    group.add_argument(
        "--lookup-max-tokens",
        type=int_in(0, MAX_DRAFT_TOKENS),
        metavar="L",
        help="lookahead: the copy doubles up to this length while accepted whole (default: 32; "
        "0 keeps it fixed)",
    )
    group.add_argument(
        "--token-cost",
        type=float_in(0.0, 1.0),
        metavar="C",
        help="lookahead: what one more token in a forward pass costs, as a fraction of a "
        "one-token pass; the window runs while its n-grams pay for its tokens at that price "
        "(default: 0.025, a 2-core CPU; 0 runs it at every step, as on a GPU)",
    )
    group.add_argument(
        "--num-draft-tokens",
        type=int_in(1, MAX_DRAFT_TOKENS),
        metavar="K",
        help="prompt_lookup, draft: tokens proposed per step",
    )
    group.add_argument(
        "--max-draft-tokens",
        type=int_in(0, MAX_DRAFT_TOKENS),
        metavar="K",
        help="prompt_lookup: the copy doubles up to this length while accepted whole "
        "(default: 0, fixed at --num-draft-tokens)",
    )
    group.add_argument(
        "--max-ngram",
        type=int_in(1, MAX_NGRAM),
        metavar="N",
        help="prompt_lookup: longest n-gram matched",
    )
    add_max_step_tokens(group)
    group.add_argument(
        "--draft-model", metavar="NAME", help="draft: the small model (same vocabulary)"
    )
    add_datastore_arg(group, "lookahead, prompt_lookup: also copy")
    sampling = parser.add_argument_group("sampling (default: greedy)")
    sampling.add_argument(
        "--sample", action="store_true", help="sample instead of taking the most likely token"
    )
    sampling.add_argument(
        "--temperature",
        type=float_in(0.0, 100.0, low_open=True),
        metavar="T",
        help="with --sample (default: 1.0)",
    )
    sampling.add_argument(
        "--top-p",
        type=float_in(0.0, 1.0, low_open=True),
        metavar="P",
        help="with --sample: nucleus size (default: 1.0, off)",
    )
    sampling.add_argument(
        "--top-k",
        type=int_in(0, 1 << 30),
        metavar="K",
        help="with --sample: keep the K most likely tokens (default: 0, off)",
    )
    sampling.add_argument(
        "--seed",
        type=int_in(0, (1 << 63) - 1),
        metavar="S",
        help="with --sample: random seed (default: fresh each run)",
    )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def method_options(args: argparse.Namespace, draft_model: Any = None) -> dict[str, Any]:
    """The keyword options for ``lookahead.generate`` from the parsed arguments.

    Only options given on the command line are passed (the library's defaults apply to the
    others). ``draft_model`` is the loaded draft for ``--method draft``.

    Raises ``UsageError`` for an option that the method does not take, ``--method draft``
    without ``--draft-model`` and sampling options without ``--sample``.
    """
    accepted = METHOD_OPTIONS[args.method]
    options: dict[str, Any] = {}
    for name in _SHAPE_OPTIONS:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name not in accepted:
            takers = [m for m, names in METHOD_OPTIONS.items() if name in names]
            raise UsageError(
                _flag(name), f"applies to --method {' or '.join(takers)}, not {args.method}"
            )
        options[name] = value
    if options.get("workload") is not None and options.get("window", "auto") != "auto":
        raise UsageError("--workload", f"chooses a tuned shape; it cannot go with --window "
                         f"{options['window']}")
    if args.method == "lookahead" and options.get("lookup_tokens") == 0:
        raise UsageError("--lookup-tokens", "must be at least 1 with --method lookahead "
                         "(0 turns the copy off for --method draft only)")
    if args.method == "lookahead" and "window" not in options:
        options["window"] = "auto"  # resolved by make_decoder; --ngram/--guess still apply
    if args.method == "draft":
        if not getattr(args, "draft_model", None):
            raise UsageError("--draft-model", "--method draft needs a draft model")
        if draft_model is not None:
            options["draft_model"] = draft_model
    elif getattr(args, "draft_model", None):
        raise UsageError("--draft-model", f"applies to --method draft, not {args.method}")
    check_datastore_arg(args)
    if getattr(args, "sample", False):
        options["do_sample"] = True
    for name in _SAMPLING_OPTIONS:
        value = getattr(args, name, None)
        if value is None:
            continue
        if not options.get("do_sample"):
            raise UsageError(_flag(name), "needs --sample (decoding is greedy without it)")
        options[name] = value
    return options


def add_max_step_tokens(parser) -> None:
    """--max-step-tokens T, for every method that proposes (``lookahead.generate``'s
    ``max_step_tokens``)."""
    parser.add_argument(
        "--max-step-tokens",
        type=int_in(1, 1 << 16),
        metavar="T",
        help="lookahead, prompt_lookup, draft: the most tokens one forward pass is fed, the "
        "last accepted token included (default: no cap); where a pass of a few more tokens "
        "costs much more than one, the knee of `lookahead tune`'s cost curve",
    )


def add_datastore_arg(parser, who: str) -> None:
    """--datastore stdlib|python|PATH, the corpus that ``who`` ("lookahead, prompt_lookup:
    also copy") copies from; one wording for every command that takes it."""
    parser.add_argument(
        "--datastore",
        metavar="stdlib|python|PATH",
        help=f"{who} from this corpus where the text itself has no match: 'stdlib' (the "
        "Python standard library), 'python' (it and the installed packages' code) or a file "
        "or folder of text (tokenized once, then cached)",
    )


def check_copying_method(flag: str, method: str) -> None:
    """``flag`` (``--memory``, ``--datastore``) needs a method that copies from earlier text."""
    if method not in MEMORY_METHODS:
        raise UsageError(flag, f"applies to --method {' or '.join(MEMORY_METHODS)}, "
                         f"not {method}")


def check_datastore_arg(args: argparse.Namespace) -> None:
    """``--datastore`` names a corpus that exists, for a method that copies from one."""
    spec = getattr(args, "datastore", None)
    if not spec:
        return
    check_copying_method("--datastore", args.method)
    try:
        check_spec(spec)
    except FileNotFoundError as error:
        raise UsageError("--datastore", str(error).removeprefix("datastore: ")) from None


# ----------------------------------------------------------------------------- running


def set_handler(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int]) -> None:
    """Make ``run`` the subcommand's ``func``: a ``UsageError`` becomes an argparse error of
    ``parser`` (exit status 2); a model that is not installed, a message and status 1."""

    def func(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except UsageError as error:
            parser.error(str(error))
        except ModelNotAvailableError as error:
            print(f"{parser.prog}: error: {error}", file=sys.stderr)
            return 1
        return 0  # not reached: parser.error exits

    parser.set_defaults(func=func)


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
        # Loading a small model takes a second: the per-tensor progress bar is only noise.
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    packed = getattr(args, "packed_weights", False)
    device = device_arg(args)
    model, tokenizer = load_named("--model", args.model, args.dtype, packed, device)
    draft = None
    if has_method and args.method == "draft":
        draft, _ = load_named("--draft-model", args.draft_model, args.dtype, packed, device)
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


def device_arg(args: argparse.Namespace) -> Any:
    """``--device`` as a ``torch.device`` (None: not given); a device this machine lacks is a
    ``UsageError`` naming the flag, before any model loads."""
    try:
        return resolve_device(getattr(args, "device", None), "--device")
    except ValueError as error:
        raise UsageError("--device", str(error).removeprefix("--device ")) from None


def load_named(option: str, name: str, dtype: str, packed: bool | str | None = False,
               device: Any = None) -> tuple[Any, Any]:
    """``lookahead.load_model(name, dtype, device=device)``; an unknown name or path is a
    ``UsageError``.

    ``packed``: pack the weights (``--packed-weights``), not (False), or where the model
    allows it (None, the CLI's default).
    """
    try:
        model, tokenizer = load_model(name, dtype=dtype, device=device)
    except ModelNotAvailableError:
        raise
    except (ValueError, FileNotFoundError) as error:
        raise UsageError(option, str(error)) from None
    apply_packing(model, packed)
    return model, tokenizer


def apply_packing(model: Any, packed: bool | str | None) -> bool | str:
    """``lookahead.packing.apply_packing``; a model that cannot be packed when
    ``--packed-weights`` (or ``--stream-kernel``) asks for it is a ``UsageError`` naming the
    flag."""
    problem = packing.packing_problem(model, packed) if packed else None
    if problem is not None:
        raise UsageError(packing_flag(packed), problem)
    return packing.apply_packing(model, packed)


def packing_flag(packed: bool | str | None) -> str:
    """The flag that asked for ``packed`` (``args.packed_weights``)."""
    return "--stream-kernel" if packed == packing.STREAM else "--packed-weights"


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


# ----------------------------------------------------------------------------- streamed text


class TextDelta:
    """Turns tokens arriving a few at a time into the new text to print.

    Decoding each token alone breaks characters spread over several byte-level tokens (and
    drops the leading spaces of SentencePiece tokens), and decoding the whole answer every step
    costs O(n²). Like vLLM's incremental detokenizer, this decodes a short window: the tokens
    since the text last printed (``ids[prefix:]``) against the same window without the new
    tokens (``ids[prefix:read]``); the difference is the new text. Text ending in U+FFFD (an
    unfinished UTF-8 sequence) is held back until the next token completes it.

    ``context``: the last few prompt tokens, decoded in front of the first new tokens so that
    a completion's first word gets the space it has after the prompt (not part of ``ids``).

    Example::

        delta = TextDelta(tokenizer, context=input_ids[0, -4:].tolist())
        for tokens in lookahead.stream(model, input_ids, 64):
            print(delta.push(tokens), end="", flush=True)
        print(delta.finish())
    """

    def __init__(
        self, tokenizer: Any, *, context: Sequence[int] = (), skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._all: list[int] = list(context)  # context, then the new tokens
        self._context = len(self._all)
        self._prefix = 0  # start of the decoded window
        self._read = self._context  # end of the tokens whose text is printed

    @property
    def ids(self) -> list[int]:
        """The new tokens pushed so far."""
        return self._all[self._context :]

    def push(self, tokens: Sequence[int]) -> str:
        """Add ``tokens``; return the text they complete (possibly empty)."""
        self._all.extend(tokens)
        printed = self._decode(self._all[self._prefix : self._read])
        text = self._decode(self._all[self._prefix :])
        if len(text) <= len(printed) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._all)
        return text[len(printed) :]

    def finish(self) -> str:
        """The text still held back (an unfinished character at the very end)."""
        printed = self._decode(self._all[self._prefix : self._read])
        text = self._decode(self._all[self._prefix :])
        self._prefix = self._read = len(self._all)
        return text[len(printed) :]

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip) if ids else ""
