"""Float32 on packed weights against plain ones, end to end: speed, and the same outputs?

Packed float32 weights (``packed_weights=True``) take their products weight first, ``W @ x.T``
(one token's in blocks of W's rows), where plain ones run ``x @ W.T``, and those sums differ
in the last bits
(``benchmarks/packed_weights.py --dtype float32`` gives the largest logit difference). This script asks what that does to whole generations:
each prompt is generated greedily by HF ``generate`` on the plain weights (the reference), by
HF ``generate`` on the packed ones, and by each of our methods on both, in turn (prompt-major,
so a slow spell hits every run alike). It prints each run's tokens/s and on how many prompts
its output was the reference's, token for token.

    python benchmarks/packed_float32.py --threads 2 --limit 10      # 10 per data set
    python benchmarks/packed_float32.py --limit 1 --max-new-tokens 16  # a smoke run
"""

from __future__ import annotations

import argparse
import sys

from packed_weights import load_settings  # threads, one model per setting

from lookahead.cli.bench_args import comma_list, positive_int
from lookahead.bench.methods import METHODS, MethodOptions, measure
from lookahead.bench.datasets import BUNDLED_DATASETS, encode_prompt, load_prompts

REFERENCE = ("hf", "plain")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    parser.add_argument("--datasets", type=comma_list(BUNDLED_DATASETS),
                        default=("humaneval", "mtbench", "gsm8k"))
    parser.add_argument("--limit", type=positive_int, default=5, help="prompts per data set")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256)
    parser.add_argument("--methods", type=comma_list(METHODS),
                        default=("lookahead", "prompt_lookup"),
                        help="our methods to run on both (default: lookahead,prompt_lookup)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models, tokenizer, _ = load_settings(args, {
        "plain": dict(dtype="float32", packed_weights=False),
        "packed": dict(dtype="float32", packed_weights=True),
    })
    runs = [REFERENCE, ("hf", "packed")] + [(m, w) for m in args.methods for w in models]
    prompts = [p for name in args.datasets for p in load_prompts(name, args.limit)]
    options, pad = MethodOptions(), tokenizer.eos_token_id
    warm = encode_prompt(tokenizer, prompts[0])
    for method, weights in runs:
        measure(method, models[weights], warm, 32, options, pad_token_id=pad)
    tokens = {run: 0 for run in runs}
    seconds = {run: 0.0 for run in runs}
    same = {run: 0 for run in runs}
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt)
        outputs = {}
        for run in runs:
            result = measure(run[0], models[run[1]], ids, args.max_new_tokens, options,
                             pad_token_id=pad)
            outputs[run] = result.tokens
            tokens[run] += result.new_tokens
            seconds[run] += result.seconds
        for run in runs:
            same[run] += outputs[run] == outputs[REFERENCE]
        print(f"{prompt.id}: identical so far: "
              + ", ".join(f"{m} {w} {same[(m, w)]}" for m, w in runs[1:]), flush=True)
    print(f"\n{args.model} float32, {len(prompts)} prompts ({', '.join(args.datasets)}), "
          f"{args.max_new_tokens} new tokens at most, greedy\n")
    print("| method | weights | tok/s | vs HF plain | identical to HF plain |\n|---|---|--:|--:|--:|")
    reference_speed = tokens[REFERENCE] / seconds[REFERENCE]
    for run in runs:
        speed = tokens[run] / seconds[run]
        identical = "reference" if run == REFERENCE else f"{same[run]}/{len(prompts)}"
        print(f"| {run[0]} | {run[1]} | {speed:.1f} | {speed / reference_speed:.2f}x | "
              f"{identical} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
