"""``lookahead tune``: measure this machine and save the best lookahead shape for a model.

lookahead tune --model smollm2-135m --dtype bfloat16 --threads 2
lookahead bench --shape auto ...          # then uses the saved shape
lookahead tune --model smollm2-135m --dataset humaneval --workload code   # for code only
lookahead bench --workload code ...       # uses that one
"""

from __future__ import annotations

import argparse
import logging
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lookahead.cli.bench_args import (
    add_model_arguments,
    apply_threads,
    comma_list,
    positive_int,
    positive_int_list,
    quiet_loading,
    shape_arg,
)
from lookahead.cli.bench import USER_ERRORS
from lookahead.bench.tune import DEFAULT_DATASETS, SAMPLES, TuneConfig, tune
from lookahead.bench.shape_search import DEFAULT_SHAPES, SELECT, default_row, versus_default
from lookahead.bench.cost_curve import DEFAULT_TOKENS
from lookahead.profiles import (
    DEFAULT_LOOKUP_TOKENS,
    DEFAULT_TOKEN_COST,
    STEP_KEY,
    saved_profile_path,
    shape_label,
)
from lookahead.cli.loading import check_packing_dtype
from lookahead.cli.options import add_datastore_arg, workload_arg
from lookahead.argtypes import float_in, int_in
from lookahead.config import MAX_DRAFT_TOKENS
from lookahead.devices import resolve_device

logger = logging.getLogger(__name__)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "tune",
        description="Measure the forward-cost curve (latency of one forward pass with k new "
        "tokens) and the acceptance of a few lookahead shapes on sample prompts; predict each "
        "shape's tokens/s and save the best in a profile that --shape auto reads.",
    )
    add_model_arguments(parser)
    parser.add_argument("--dataset", default=DEFAULT_DATASETS,
                        help=f"sample prompts: data sets or JSONL files, comma-separated "
                        f"(default {DEFAULT_DATASETS})")
    parser.add_argument("--limit", type=positive_int, default=2,
                        help="sample prompts per data set (2)")
    parser.add_argument("--sample", choices=SAMPLES, default="spread",
                        help="take the sample prompts spread evenly across each data set "
                        "(default) or its first ones")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128, help="(128)")
    parser.add_argument(
        "--tokens",
        type=positive_int_list,
        default=DEFAULT_TOKENS,
        help="forward sizes k of the cost curve (default "
        + ",".join(map(str, DEFAULT_TOKENS))
        + ")",
    )
    parser.add_argument("--repeats", type=positive_int, default=5, help="timings per k (5)")
    parser.add_argument(
        "--shapes",
        type=_shape_list,
        default=DEFAULT_SHAPES,
        help="WxNxG or WxNxGxL shapes to try, L the lookup continuation's length (default "
        + ",".join("x".join(map(str, s)) for s in DEFAULT_SHAPES)
        + ")",
    )
    parser.add_argument(
        "--select",
        choices=SELECT,
        default="predicted",
        help="choose by the curve's prediction (default) or by the sample runs' timing",
    )
    parser.add_argument("--margin", type=float_in(0.0, 1.0, high_open=True), default=0.03,
                        help="keep the default shape unless another is predicted faster by "
                        "more than this fraction (0.03), no slower on any data set, and "
                        "faster on most sample prompts")
    parser.add_argument("--workload", type=workload_arg, metavar="NAME",
                        help="save the profile under this name (e.g. code, tuned with --dataset "
                        "humaneval), read by --workload NAME of the other commands, instead of "
                        "as the model's general profile")
    parser.add_argument("--cost-scales", type=_scale_list, default=(1.0,), metavar="X[,X...]",
                        help="run each shape at the curve's token cost times each of these, "
                        "and choose the cost with the shape (1: the curve's alone)")
    parser.add_argument("--max-step-tokens", type=_cap_list, default=(None,),
                        metavar="T[,T...]",
                        help="run each shape with each of these caps on the tokens a step "
                        "feeds (0: no cap), and choose the cap with the shape (default 0); "
                        "e.g. 0,4,6 where the cost curve bends after a few tokens")
    add_datastore_arg(parser, "the shapes also copy")
    parser.add_argument("--no-save", action="store_true", help="print, but save no profile")
    parser.set_defaults(func=run)


def _cap_list(text: str) -> tuple[int | None, ...]:
    """``0,4,6`` as (None, 4, 6): 0 is no cap."""
    return tuple(int_in(0, 1 << 16)(item) or None for item in comma_list()(text))


def _scale_list(text: str) -> tuple[float, ...]:
    return tuple(float_in(0.0, 10.0)(item) for item in comma_list()(text))


def _shape_list(text: str) -> tuple[tuple[int, ...], ...]:
    shapes = []
    for item in comma_list()(text):
        if item.strip().lower() == "auto":
            raise argparse.ArgumentTypeError(
                "--shapes lists WxNxG shapes; 'auto' is what tune makes"
            )
        parts = item.lower().split("x")
        if len(parts) not in (3, 4):
            raise argparse.ArgumentTypeError(
                f"each shape is WxNxG or WxNxGxL, such as 2x5x4 or 2x5x4x16, got {item!r}"
            )
        lookup = parts.pop() if len(parts) == 4 else None  # WxNxGxL
        shape = shape_arg("x".join(parts))
        if lookup is not None:
            try:
                shape = (*shape, int_in(1, MAX_DRAFT_TOKENS)(lookup))
            except argparse.ArgumentTypeError as error:
                message = f"L (lookup_tokens) in {item!r}: {error}"
                raise argparse.ArgumentTypeError(message) from None
        shapes.append(shape)
    return tuple(shapes)


def run(args: argparse.Namespace) -> int:
    apply_threads(args.threads)
    quiet_loading(args)
    console = Console(stderr=True)
    try:
        check_packing_dtype(args)  # naming the flag, where TuneConfig would name the field
        resolve_device(args.device, "--device")
        config = TuneConfig(
            model=args.model,
            dtype=args.dtype,
            tokens=args.tokens,
            repeats=args.repeats,
            shapes=args.shapes,
            dataset=args.dataset,
            limit=args.limit,
            max_new_tokens=args.max_new_tokens,
            select=args.select,
            sample=args.sample,
            packed_weights=args.packed_weights,
            margin=args.margin,
            cache_dir=args.cache_dir,
            workload=args.workload,
            datastore=args.datastore,
            cost_scales=args.cost_scales,
            step_caps=args.max_step_tokens,
            device=args.device,
        )
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("loading", total=None)

            def update(done: int, total: int, description: str) -> None:
                progress.update(task, completed=done, total=total, description=description)

            profile = tune(config, progress=update, save=not args.no_save)
    except USER_ERRORS as error:
        logger.debug("lookahead tune failed", exc_info=True)  # -vv shows the traceback
        print(f"lookahead tune: error: {error}", file=sys.stderr)
        return 2
    print(profile_table(profile))
    if not args.no_save:
        path = saved_profile_path(profile, args.cache_dir)
        print(f"\nsaved {path} and {path.with_suffix('.png')}", file=sys.stderr)
    return 0


def profile_table(profile: dict) -> str:
    """The curve and the shapes as Markdown."""
    curve = profile["curve"]
    base = profile["autoregressive_predicted_tokens_per_second"]
    sets = list(profile["shapes"][0].get("predicted_per_dataset", {})) if profile["shapes"] else []
    default = default_row(profile["shapes"])
    lines = [
        (
            f"{profile['model']} {profile['dtype']} on {profile['device']}, "
            f"{profile['threads']} threads"
            + (f", workload {profile['workload']}" if profile.get("workload") else "")
            + (f", datastore {profile['datastore']}" if profile.get("datastore") else "")
        ),
        "",
        f"forward cost (ms) with k new tokens on a cached {curve['prompt_tokens']}-token prompt:",
        "",
        "| k | " + " | ".join(map(str, curve["tokens"])) + " |",
        "|---" * (1 + len(curve["tokens"])) + "|",
        "| ms | " + " | ".join(f"{1000 * s:.1f}" for s in curve["seconds"]) + " |",
        "",
        (
            "| W | N | G | L | k | T | tokens/step | fwd tokens | predicted tok/s | predicted speed-up "
            f"| predicted tok/s {' / '.join(sets)} | vs default per prompt (faster on) "
            "| measured tok/s | step ms predicted/measured |"
        ),
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in profile["shapes"]:
        per_set = row.get("predicted_per_dataset", {})
        lines.append(
            f"| {row['window']} | {row['ngram']} | {row['guess']} "
            f"| {row.get('lookup_tokens', DEFAULT_LOOKUP_TOKENS)} "
            f"| {row.get('token_cost', DEFAULT_TOKEN_COST):g} "
            f"| {row.get(STEP_KEY) or '-'} "
            f"| {row['tokens_per_step']:.2f} "
            f"| {row['mean_forward_tokens']:.1f} | {row['predicted_tokens_per_second']:.1f} "
            f"| {row['predicted_tokens_per_second'] / base:.2f}x "
            f"| {' / '.join(f'{per_set.get(name, 0.0):.1f}' for name in sets)} "
            f"| {_versus_cell(row, default)} | {row['measured_tokens_per_second']:.1f} "
            f"| {row['predicted_step_ms']:.1f} / {row['measured_step_ms']:.1f} |"
        )
    best = profile["best"]
    lines += [
        "",
        (
            f"autoregressive predicted: {base:.1f} tok/s; step overhead beside the forward "
            f"pass: {profile.get('step_overhead_ms', 0.0):.1f} ms; best ({profile['select']}): "
            + shape_label(best) + f" k={best.get('token_cost', DEFAULT_TOKEN_COST):g}"
        ),
    ]
    return "\n".join(lines)


def _versus_cell(row: dict, default: dict | None) -> str:
    versus = None if default is None or row is default else versus_default(row, default)
    return "-" if versus is None else f"{versus.speedup:.2f}x ({versus.won}/{versus.prompts})"
