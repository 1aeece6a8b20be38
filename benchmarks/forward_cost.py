"""The forward-cost curve in each dtype: what a pass of k new tokens costs on this CPU.

Lookahead pays where a pass of many tokens costs little more than a pass of one. Whether it
does depends on the dtype and the CPU: with native bfloat16 (AVX512-BF16 or AMX) a bfloat16
pass of 16 tokens costs about what one token does; on an AVX2-only CPU oneDNN converts on the
fly and the bfloat16 cost grows with k, while float32's stays flat. This script loads the model
in each dtype and measures, in alternating rounds, the median cost of a pass of k new tokens
after a HumanEval prompt (``lookahead.bench.cost_curve.forward_cost_curve``), and says which dtype
``"auto"`` picks here (``lookahead.models.registry.preferred_dtype``).

    python benchmarks/forward_cost.py --threads 2 --plot docs/results/forward-cost.png
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch
from packed_weights import curves, load_settings, plot  # the same, per dtype

from lookahead.cli.bench_args import dtype_list, positive_int
from lookahead.models.registry import AUTO_DTYPE, dtype_name


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", type=dtype_list, default=("float32", "bfloat16"),
                        help="comma-separated (default: float32,bfloat16)")
    parser.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    parser.add_argument("--tokens", default="1,2,4,8,16,32,64", help="forward sizes k")
    parser.add_argument("--repeats", type=positive_int, default=3, help="passes per round")
    parser.add_argument("--rounds", type=positive_int, default=3, help="alternating rounds")
    parser.add_argument("--plot", type=Path, help="save the curves as this PNG")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tokens = [int(k) for k in args.tokens.split(",")]
    models, _, prompt = load_settings(args, {d: dict(dtype=d) for d in args.dtypes})
    costs = curves(models, prompt, tokens, args)
    auto = dtype_name(AUTO_DTYPE)
    setting = (f"{args.model}, {torch.get_num_threads()} threads, {prompt.shape[1]}-token "
               f"prompt, {platform.processor() or platform.machine()}, "
               f"{torch.backends.cpu.get_cpu_capability()}")
    print(f"{setting}; median ms of a forward pass of k new tokens ({args.rounds} rounds of "
          f"{args.repeats}); dtype 'auto' is {auto} here\n")
    if args.plot:
        plot(costs, tokens, setting, args.plot)
    names = list(costs)
    print("| k | " + " | ".join(f"{name} ms" for name in names) + " |")
    print("|--:|" + "--:|" * len(names))
    for i, k in enumerate(tokens):
        print(f"| {k} | " + " | ".join(f"{1000 * costs[n][i]:.1f}" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
