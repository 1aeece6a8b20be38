"""Issue 2's quick figure: SmolLM2-135M, first 10 HumanEval prompts, greedy, 256 new tokens.

HF ``generate`` in bfloat16 and float32 against our autoregressive, lookahead and prompt-lookup
decoding in bfloat16, in one process on the same prompts. Prints tokens/s, speed-ups (over HF
bf16 and over the faster of HF bf16/fp32), tokens per step and how many outputs are identical
to HF's; writes results.json, results.md and plots to --out.

    python benchmarks/bench_quick.py                 # the full figure (~5-10 min on 2 cores)
    python benchmarks/bench_quick.py --limit 2 --max-new-tokens 64     # a smoke run
    python benchmarks/bench_quick.py --shape auto    # the shape `lookahead tune` chose
"""

from __future__ import annotations

import argparse
import sys

from lookahead.cli.bench_args import (
    add_shape_arguments,
    apply_threads,
    positive_int,
    quiet_loading,
    shape_from_args,
)
from lookahead.cli.bench import run_with_progress
from lookahead.bench.methods import MethodOptions
from lookahead.bench.report import markdown_table, write_results
from lookahead.bench.runner import BenchConfig
from lookahead.config import LookaheadConfig

MODEL = "smollm2-135m"
DTYPE = "bfloat16"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=positive_int, default=10)
    parser.add_argument("--max-new-tokens", type=positive_int, default=256)
    parser.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    parser.add_argument("--out", default="bench-out/quick")
    add_shape_arguments(parser)
    args = parser.parse_args(argv)
    args.model, args.dtype, args.cache_dir = MODEL, DTYPE, None  # what shape_from_args reads
    apply_threads(args.threads)
    quiet_loading(args)
    config = BenchConfig(
        model=MODEL,
        datasets=("humaneval",),
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        methods=("hf", "autoregressive", "lookahead", "prompt_lookup"),
        dtype=DTYPE,
        baseline_dtypes=("bfloat16", "float32"),
        options=MethodOptions(lookahead=LookaheadConfig(**shape_from_args(args))),
    )
    results = run_with_progress(config)
    print(markdown_table(results))
    paths = write_results(results, args.out)
    print("\nwrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
