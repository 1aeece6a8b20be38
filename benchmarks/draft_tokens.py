"""How many tokens should the draft model propose a step on this machine?

The draft method's step costs its draft passes plus one target pass over K + 1 tokens. On a
2-core CPU that pass grows with K (Qwen2.5-Coder-1.5B: 186 ms for 6 tokens, 253 for 8),
while a longer draft is accepted less often towards its end, so the best K is a property of
the machine. For each prompt, HF ``generate`` (the baseline) and then the draft method at each
K run in turn, prompt-major, so that a slow spell hits every run alike. Prints tokens/s, the
speed-up over HF, tokens per step and identity with HF's text per K.

    python benchmarks/draft_tokens.py --threads 2 --limit 5 --max-new-tokens 128 \\
        --draft-tokens 4,5,6,8
"""

from __future__ import annotations

import argparse
import sys

from lookahead.cli.bench_args import apply_threads, positive_int, positive_int_list, quiet_loading
from lookahead.bench.methods import Measurement, MethodOptions, measure
from lookahead.config import DraftConfig
from lookahead.bench.datasets import encode_prompt, load_prompts
from lookahead.models.load import load_model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=positive_int, default=5)
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--draft-tokens", type=positive_int_list, default=(4, 5, 6, 8),
                        help="the K to compare (default: 4,5,6,8)")
    parser.add_argument("--threads", type=positive_int)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    apply_threads(args.threads)
    quiet_loading(args)
    # As `lookahead bench` loads them: packed where that keeps every sum.
    model, tokenizer = load_model(args.model, args.dtype, packed_weights=True)
    draft, _ = load_model(args.draft_model, args.dtype, packed_weights=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    runs = {"hf": ("hf", MethodOptions())} | {
        f"draft K={k}": ("draft", MethodOptions(draft=DraftConfig(num_draft_tokens=k)))
        for k in args.draft_tokens
    }
    prompts = [encode_prompt(tokenizer, p) for p in load_prompts(args.dataset, args.limit)]
    for method, options in runs.values():  # warm-up, on the first prompt
        measure(method, model, prompts[0], 16, options, draft_model=draft, pad_token_id=pad)
    measured: dict[str, list[Measurement]] = {label: [] for label in runs}
    for number, ids in enumerate(prompts, 1):
        for label, (method, options) in runs.items():
            measured[label].append(measure(method, model, ids, args.max_new_tokens, options,
                                           draft_model=draft, pad_token_id=pad))
        print(f"done prompt {number}/{len(prompts)}", file=sys.stderr, flush=True)
    print(report(args, measured))
    return 0


def report(args, measured: dict[str, list[Measurement]]) -> str:
    hf = measured["hf"]
    hf_rate = sum(len(m.tokens) for m in hf) / sum(m.seconds for m in hf)
    lines = [f"{args.model} drafted by {args.draft_model}, {args.dtype} packed, first "
             f"{args.limit} {args.dataset} prompts, {args.max_new_tokens} new tokens, greedy",
             "", "| run | tok/s | vs HF | tokens/step | identical to HF |",
             "|---|--:|--:|--:|--:|"]
    for label, runs in measured.items():
        tokens, seconds = sum(len(m.tokens) for m in runs), sum(m.seconds for m in runs)
        steps = sum(m.steps for m in runs) or 1
        same = sum(m.tokens == h.tokens for m, h in zip(runs, hf))
        lines.append(f"| {label} | {tokens / seconds:.1f} | {tokens / seconds / hf_rate:.2f}x | "
                     f"{tokens / steps:.2f} | {same}/{len(runs)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
