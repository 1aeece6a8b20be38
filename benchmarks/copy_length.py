"""How long should a copied continuation be? Fixed lengths against one that grows.

Lookahead verifies, beside its pool's n-grams, the tokens that followed an earlier occurrence
of the text's last n-gram (``lookup_tokens`` of them); prompt lookup verifies such a copy alone
(``num_draft_tokens``). With ``lookup_max_tokens`` (``max_draft_tokens``) above that, the
length doubles after each copy accepted whole and falls back after one that is not. This
runs each variant on the same prompts, in the same process, and prints tokens/s and tokens
per step per data set:

    python benchmarks/copy_length.py --threads 2 --skip 5 --limit 10
    python benchmarks/copy_length.py --threads 2 --method prompt_lookup

Under bf16 the variants' outputs may differ a little (a forward pass of another size rounds
differently), so each is compared on nearly, not exactly, the same text.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import lookahead
from lookahead.cli.bench_args import apply_threads, quiet_loading
from lookahead.bench.datasets import encode_prompt, load_prompts

VARIANTS = {
    "lookahead": {
        "fixed 8": dict(lookup_tokens=8, lookup_max_tokens=0),
        "fixed 16": dict(lookup_tokens=16, lookup_max_tokens=0),
        "8, growing to 32": dict(lookup_tokens=8, lookup_max_tokens=32),
        "8, growing to 64": dict(lookup_tokens=8, lookup_max_tokens=64),
    },
    "prompt_lookup": {
        "fixed 10": dict(num_draft_tokens=10, max_draft_tokens=0),
        "fixed 20": dict(num_draft_tokens=20, max_draft_tokens=0),
        "10, growing to 40": dict(num_draft_tokens=10, max_draft_tokens=40),
        "5, growing to 40": dict(num_draft_tokens=5, max_draft_tokens=40),
    },
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--datasets", default="humaneval,mtbench,gsm8k")
    parser.add_argument("--skip", type=int, default=5, help="prompts to leave out first")
    parser.add_argument("--limit", type=int, default=10, help="prompts per data set")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--method", choices=tuple(VARIANTS), default="lookahead")
    parser.add_argument("--shape", default="2x5x4", help="lookahead: WxNxG (the default shape)")
    args = parser.parse_args(argv)
    apply_threads(args.threads)
    quiet_loading(args)
    window, ngram, guess = (int(x) for x in args.shape.split("x"))
    model, tokenizer = lookahead.load_model(args.model, "bfloat16")
    shape = dict(window=window, ngram=ngram, guess=guess) if args.method == "lookahead" else {}
    runs = {name: dict(v, **shape) for name, v in VARIANTS[args.method].items()}
    warm = encode_prompt(tokenizer, load_prompts("humaneval", 1)[0])
    for options in runs.values():
        lookahead.generate(model, warm, 32, args.method, **options)
    label = f"W{window} N{ngram} G{guess}" if shape else args.method
    print(f"{args.model} bf16, {label}, prompts {args.skip + 1}-"
          f"{args.skip + args.limit}, {args.max_new_tokens} new tokens\n")
    print("| data set | copy length | tok/s | tokens/step |\n|---|---|--:|--:|")
    for dataset in args.datasets.split(","):
        totals = defaultdict(lambda: [0, 0.0, 0])  # new tokens, seconds, steps
        for prompt in load_prompts(dataset, args.skip + args.limit)[args.skip:]:
            ids = encode_prompt(tokenizer, prompt)
            for name, options in runs.items():
                stats = lookahead.generate(model, ids, args.max_new_tokens, args.method,
                                           **options).stats
                total = totals[name]
                total[0] += stats.new_tokens
                total[1] += stats.seconds
                total[2] += stats.steps
        for name, (tokens, seconds, steps) in totals.items():
            print(f"| {dataset} | {name} | {tokens / seconds:.1f} | {tokens / steps:.2f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
