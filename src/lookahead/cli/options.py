"""The flags the subcommands share: model, method and sampling options, and their checks.

A subcommand module adds its parser, then::

    add_model_args(parser)                   # --model --dtype --threads --[no-]packed-weights
    add_method_args(parser)                  # --method, each method's shape, --sample ...

Bad combinations of options (``--window`` with ``--method prompt_lookup``, ``--temperature``
without ``--sample``, an unknown ``--model``) raise ``UsageError``; ``loading.set_handler`` turns
it into the usual argparse error (usage line, the option's name, exit status 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Callable
from itertools import chain
from typing import Any

from lookahead.argtypes import UsageError, float_in, int_in
from lookahead.config import (
    COPY_SOURCES,
    SAMPLING_OPTIONS,
    LookaheadConfig,
    check_workload,
    copying_methods,
    method_names,
    method_specs,
    options_by_method,
)
from lookahead.kernels import Kernel
from lookahead.models.registry import AUTO_DTYPE, DEFAULT_MODEL, ModelNotAvailableError
from lookahead.models.registry import dtype_name as canonical_dtype_name
from lookahead.sources.datastore import check_spec

logger = logging.getLogger(__name__)

# The texts to copy from and the draft model are method options whose flags name things to
# load: they are handled apart from the others.
_LOADED = (*COPY_SOURCES, "draft_model")
# The sampling options but do_sample, whose flag is --sample.
_SAMPLING_OPTIONS = tuple(name for name in SAMPLING_OPTIONS if name != "do_sample")


# ----------------------------------------------------------------------------- argument types


def window_arg(text: str) -> int | str:
    """An argparse ``type`` for ``--window``: "auto" (the tuned shape) or an int window."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer, got {text!r}") from None
    return int_in(*_field_range(LookaheadConfig, "window"))(text)


def _default_shape() -> str:
    default = LookaheadConfig()
    return f"W{default.window} N{default.ngram} G{default.guess}"


WINDOW_HELP = ("lookahead: window size, or 'auto' (the default): the shape `lookahead tune` "
               f"saved for this model and machine, else {_default_shape()}")


def workload_arg(text: str) -> str:
    """An argparse ``type`` for ``--workload``: the name of a tuned profile."""
    try:
        return check_workload(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


DTYPE_HELP = (
    "weight dtype: auto, bfloat16, float32, ... (default: auto, bfloat16 where the CPU "
    "multiplies it natively (AVX512-BF16 or AMX), else float32)"
)


def dtype_name(text: str) -> str:
    """An argparse ``type``: a dtype alias ("bf16") -> its canonical name ("bfloat16"); "auto"
    stays "auto" (``load_model`` decides: a GGUF model quantized, else this machine's choice,
    ``lookahead.models.registry.preferred_dtype``)."""
    try:
        if text.strip().lower() == AUTO_DTYPE:
            return AUTO_DTYPE
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
        "a .gguf file or a Hugging Face hub name (owner/repo, owner/repo:Q5_K_M, "
        "owner/repo/file.gguf)" + (f" (default: {default})" if default else ""),
    )
    group.add_argument(
        "--dtype", type=dtype_name, default=AUTO_DTYPE, help=DTYPE_HELP
    )
    group.add_argument(
        "--dequantize", action="store_true",
        help="a GGUF model (the bundled ones, a .gguf file) is de-quantised into --dtype "
        "instead of keeping its linear layers quantized on the integer kernel (an explicit "
        "--dtype, --packed-weights or --stream-kernel does the same)",
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
    add_kernel_args(group)


def add_kernel_args(group) -> None:
    """``--packed-weights``, ``--no-packed-weights`` and ``--stream-kernel``: one value,
    ``args.packed_weights``, a ``Kernel`` (``PACKED``, ``PLAIN``, ``STREAM``) or None (not
    given: packed where that keeps every sum)."""
    group.add_argument(
        "--packed-weights",
        dest="packed_weights",
        action="store_const",
        const=Kernel.PACKED,
        default=None,
        help="swap the linear layers for faster ones on a CPU: bfloat16 weights laid out once "
        "for oneDNN, the same sums; float32 products taken weight first, sums that differ in "
        "the last bits (default: on for bfloat16 where the CPU can pack it, "
        "off for float32)",
    )
    group.add_argument(
        "--no-packed-weights",
        dest="packed_weights",
        action="store_const",
        const=Kernel.PLAIN,
        help="keep the linear layers as loaded (plain torch weights)",
    )
    group.add_argument(
        "--stream-kernel",
        dest="packed_weights",
        action="store_const",
        const=Kernel.STREAM,
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
    """``--method`` with each method's options, and the sampling options.

    Every option that a method's config gives a help text (``lookahead.config.option``)
    becomes a flag here, with the range, default and text of its field.
    """
    group = parser.add_argument_group("decoding method")
    group.add_argument("--method", choices=method_names(), default=default,
                       help=f"(default: {default})")
    group.add_argument("--window", type=window_arg, metavar="W", help=WINDOW_HELP)
    add_config_flags(group, skip=("window",))
    group.add_argument(
        "--workload",
        type=workload_arg,
        metavar="NAME",
        help="lookahead: the shape `lookahead tune --workload NAME` saved for this kind of text "
        "(e.g. code), else the general tuned shape",
    )
    add_max_step_tokens(group)
    group.add_argument(
        "--draft-model", metavar="NAME", help="draft: the small model (same vocabulary)"
    )
    add_datastore_arg(group, f"{', '.join(copying_methods())}: also copy")
    add_sampling_args(parser)


def config_flags() -> dict[str, list[tuple[str, object]]]:
    """Each flagged config field's name -> the (method, dataclass field) pairs that have it,
    in table order: the fields ``lookahead.config.option`` gave a help text."""
    flags: dict[str, list[tuple[str, object]]] = {}
    for spec in method_specs():
        if spec.config is None:
            continue
        for field in dataclasses.fields(spec.config):
            if "help" in field.metadata:
                flags.setdefault(field.name, []).append((spec.name, field))
    return flags


def add_config_flags(group, names: tuple[str, ...] | None = None, skip: tuple[str, ...] = (),
                     methods: tuple[str, ...] | None = None) -> None:
    """A flag (``--lookup-tokens``) for each flagged config field (``names``: those alone) of
    the methods (``methods``: those alone), typed to the widest range they allow
    (``method_options`` checks the chosen method's own), its help the field's text, the
    methods and their defaults."""
    for name, owners in config_flags().items():
        owners = [(m, f) for m, f in owners if methods is None or m in methods]
        if not owners or name in skip or (names is not None and name not in names):
            continue
        lows, highs = zip(*(field.metadata["range"] for _, field in owners))
        kind = int_in if isinstance(lows[0], int) else float_in
        defaults = {method: field.default for method, field in owners}
        shown = ""
        if any(d is not None for d in defaults.values()):
            values = set(defaults.values())
            shown = (f" (default: {values.pop()})" if len(values) == 1 else " (default: " +
                     ", ".join(f"{m} {d}" for m, d in defaults.items()) + ")")
        first = owners[0][1]
        group.add_argument(
            _flag(name), type=kind(min(lows), max(highs)), metavar=first.metadata["metavar"],
            help=f"{', '.join(m for m, _ in owners)}: {first.metadata['help']}{shown}",
        )


def _field_range(config: type, name: str) -> tuple:
    return next(f.metadata["range"] for f in dataclasses.fields(config) if f.name == name)


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """``--sample`` and the sampling options that need it."""
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
    table = options_by_method()
    accepted = table[args.method]
    options: dict[str, Any] = {}
    for name in dict.fromkeys(chain(*table.values())):
        value = getattr(args, name, None)
        if value is None or name in _LOADED:
            continue
        if name not in accepted:
            takers = [m for m, names in table.items() if name in names]
            raise UsageError(
                _flag(name), f"applies to --method {' or '.join(takers)}, not {args.method}"
            )
        _check_method_range(args.method, name, value)
        options[name] = value
    if options.get("workload") is not None and options.get("window", "auto") != "auto":
        raise UsageError("--workload", f"chooses a tuned shape; it cannot go with --window "
                         f"{options['window']}")
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


def _check_method_range(method: str, name: str, value) -> None:
    """A flag shared by methods of different ranges must lie in the chosen method's."""
    for owner, field in config_flags().get(name, ()):
        low, high = field.metadata["range"]
        numeric = isinstance(value, (int, float))  # not window="auto"
        if owner == method and numeric and not low <= value <= high:
            raise UsageError(_flag(name), f"must be in [{low}, {high}] with --method {method}, "
                             f"got {value}")


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
    if method not in copying_methods():
        raise UsageError(flag, f"applies to --method {' or '.join(copying_methods())}, "
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
