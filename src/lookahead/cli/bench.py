"""``lookahead bench``: every method on the same prompts, against HF ``generate``.

    lookahead bench --model smollm2-135m --dataset humaneval --limit 10 --max-new-tokens 256 \\
        --baseline-dtypes float32,bfloat16 --shape auto --threads 2 --out bench-out
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lookahead.bench import llamacpp
from lookahead.cli.bench_args import (
    add_model_arguments,
    add_shape_arguments,
    apply_threads,
    comma_list,
    dtype_list,
    positive_int,
    quiet_loading,
    shape_from_args,
)
from lookahead.bench.methods import MethodOptions, all_methods
from lookahead.bench.report import markdown_table, write_results
from lookahead.bench.runner import BenchConfig, run_benchmark
from lookahead.profiles import DEFAULT_SOURCE, shape_label, split_cap
from lookahead.cli.loading import check_packing_dtype
from lookahead.cli.options import add_config_flags, add_datastore_arg, add_max_step_tokens
from lookahead.config import DraftConfig, LookaheadConfig, PromptLookupConfig
from lookahead.sources.datastore import check_spec

logger = logging.getLogger(__name__)

# What a failed run reports as "lookahead bench: error: ..." (exit status 2), not a traceback.
USER_ERRORS = (ValueError, TypeError, FileNotFoundError)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        description="Measure tokens/s, speed-up over HF model.generate (greedy), tokens per "
        "step, acceptance, time to first token and exactness of each method, in one process "
        "on the same prompts. Writes results.json, results.md and PNG plots to --out.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--draft-model", help="draft model for 'draft', 'hf_assisted' and "
                        "'llamacpp_draft' (a bundled model, a .gguf file or a hub GGUF name "
                        "for that one)")
    parser.add_argument(
        "--dataset",
        type=comma_list(),
        default=("humaneval",),
        help="comma-separated: humaneval, mtbench, gsm8k or .jsonl paths (default humaneval)",
    )
    parser.add_argument("--limit", type=positive_int, default=10, help="prompts per data set (10)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256, help="(default 256)")
    parser.add_argument(
        "--methods",
        type=comma_list(all_methods()),
        help=f"comma-separated subset of {','.join(all_methods())} (default: all that apply "
        "but the llamacpp ones, which run only when named; hf, the baseline, always runs)",
    )
    parser.add_argument(
        "--baseline-dtypes",
        type=dtype_list,
        default=("float32", "bfloat16"),
        help="also time HF greedy in these dtypes, de-quantised (default float32,bfloat16; "
        "none: only on the weights the methods run on)",
    )
    add_shape_arguments(parser)
    parser.add_argument(
        "--prompt-lookup-tokens",
        type=positive_int,
        default=PromptLookupConfig.num_draft_tokens,
        help="draft tokens of prompt lookup, ours and HF's (default: %(default)s)",
    )
    parser.add_argument(
        "--draft-tokens", type=positive_int, default=DraftConfig.num_draft_tokens,
        help="tokens per step of 'draft' (and llamacpp_draft's most) (default: %(default)s)"
    )
    add_config_flags(parser, names=("draft_vocab",), methods=("draft",))
    parser.add_argument(
        "--memory",
        action="store_true",
        help="our lookahead and prompt lookup also copy from their earlier answers in the run",
    )
    add_datastore_arg(parser, "our lookahead and prompt lookup also copy")
    add_max_step_tokens(parser)
    llamacpp.add_arguments(parser)
    parser.add_argument("--out", default="bench-out", help="output folder (default bench-out)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up runs")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The ``BenchConfig`` the arguments ask for (``--shape auto`` read from the profile)."""
    from lookahead.devices import resolve_device  # imports torch: not before parsing

    check_packing_dtype(args)  # before the models load, naming the flag
    resolve_device(args.device, "--device")
    if args.datastore:
        check_spec(args.datastore)  # before the models load
    # A tuned profile may cap lookahead's steps; --max-step-tokens caps all of ours instead.
    shape, source = shape_from_args(args)
    shape, tuned_cap = split_cap(shape)
    options = MethodOptions(
        lookahead=LookaheadConfig(**shape),
        prompt_lookup=PromptLookupConfig(num_draft_tokens=args.prompt_lookup_tokens),
        draft=DraftConfig(num_draft_tokens=args.draft_tokens, draft_vocab=args.draft_vocab),
        hf_prompt_lookup_tokens=args.prompt_lookup_tokens,
        memory=args.memory,
        datastore=args.datastore,
        max_step_tokens=args.max_step_tokens,
        lookahead_step_tokens=tuned_cap,
        measured_step_costs=source == DEFAULT_SOURCE,  # untuned: this CPU's costs, measured
        llamacpp_bin=args.llamacpp_bin,
    )
    return BenchConfig(
        model=args.model,
        draft_model=args.draft_model,
        datasets=tuple(args.dataset),
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        methods=args.methods,
        dtype=args.dtype,
        baseline_dtypes=args.baseline_dtypes,
        options=options,
        warmup=not args.no_warmup,
        cache_dir=args.cache_dir,
        packed_weights=args.packed_weights,
        dequantize=args.dequantize,
        device=args.device,
    )


def run(args: argparse.Namespace) -> int:
    apply_threads(args.threads)
    quiet_loading(args)
    try:
        config = config_from_args(args)
        results = run_with_progress(config)
    except USER_ERRORS as error:
        logger.debug("lookahead bench failed", exc_info=True)  # -vv shows the traceback
        print(f"lookahead bench: error: {error}", file=sys.stderr)
        return 2
    print(markdown_table(results))
    if set(llamacpp.LLAMACPP_METHODS) & set(results["config"]["methods"]):
        print(llamacpp.comparison_table(results))
    paths = write_results(results, args.out, plots=not args.no_plots)
    print("\nwrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def run_with_progress(config: BenchConfig) -> dict:
    """``run_benchmark`` with a rich progress bar on stderr."""
    shape = config.options.lookahead
    console = Console(stderr=True)
    header = f"[bold]{config.model}[/] {config.setting}: {', '.join(config.run_methods)}"
    if "lookahead" in config.run_methods:  # the shape is news only when lookahead runs
        header += f"; lookahead {shape_label(asdict(shape), config.options.lookahead_cap)}"
    if config.options.memory:
        header += ", with memory of earlier answers"
    if config.options.datastore:
        header += f", datastore {config.options.datastore}"
    if config.options.max_step_tokens is not None:
        header += f", at most {config.options.max_step_tokens} tokens a step"
    console.print(header)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("loading models", total=None)

        def update(done: int, total: int, description: str) -> None:
            progress.update(task, completed=done, total=total, description=description)

        return run_benchmark(config, progress=update)
