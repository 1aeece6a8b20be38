"""A batch of prompts through ``lookahead.generate``: rows together vs one call per prompt.

``lookahead.generate(model, **tokenizer(prompts, padding=True))`` runs the rows of a
left-padded batch together, each step of every row in one forward pass over a batched KV
cache; this script times that against one ``lookahead.generate`` call per prompt, one after
another, and against the batch with ``batched=False`` (the rows decoded one after another
inside one call), and counts the rows whose tokens are those of the single calls.

    python benchmarks/batch_generate.py --threads 2 --max-new-tokens 32 --rounds 3
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import lookahead
from lookahead.bench.datasets import load_prompts
from lookahead.kernels.packing import apply_packing

PROMPT_SETS = ("humaneval", "mtbench")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--batch", type=int, default=4, help="prompts (default: 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--method", default="lookahead")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    return parser.parse_args(argv)


def prompts(count: int) -> list[str]:
    """``count`` prompts, alternating code and chat, of different lengths."""
    sets = [load_prompts(name, limit=count) for name in PROMPT_SETS]
    return [sets[i % len(sets)][i // len(sets)].text for i in range(count)]


def timed(call):
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = lookahead.load_model(args.model, dtype=args.dtype, device=args.device)
    packed = apply_packing(model, None)  # as the commands do by default
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = prompts(args.batch)
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    options = {"max_new_tokens": args.max_new_tokens, "method": args.method, "do_sample": False}
    lookahead.generate(model, **tokenizer(texts[:2], return_tensors="pt", padding=True),
                       **{**options, "max_new_tokens": 8})  # warm-up
    outputs: dict = {}
    runs = {"together": lambda: lookahead.generate(model, **batch, batched=True, **options),
            "apart": lambda: [lookahead.generate(model, **tokenizer(t, return_tensors="pt"),
                                                 **options) for t in texts],
            "inside": lambda: lookahead.generate(model, **batch, batched=False, **options)}
    seconds = {name: [] for name in runs}
    for _ in range(args.rounds):  # alternating, so that a busy spell hits every variant
        for name, call in runs.items():
            result, took = timed(call)
            seconds[name].append(took)
            outputs[name] = result
    together, apart, inside = outputs["together"], outputs["apart"], outputs["inside"]
    t_together, t_apart, t_inside = (statistics.median(seconds[n]) for n in runs)
    width = batch["input_ids"].shape[1]
    same = {"together": 0, "inside": 0}
    for row, single in enumerate(apart):
        new = single.new_tokens[0].tolist()
        for name, result in (("together", together), ("inside", inside)):
            same[name] += result.sequences[row, width : width + len(new)].tolist() == new
    tokens = together.stats.new_tokens
    print(f"{args.model} {model.dtype} (packed: {packed}) on {model.device}, "
          f"{torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}; {args.batch} prompts "
          f"({', '.join(str(int(m.sum())) for m in batch['attention_mask'])} tokens), "
          f"{args.method}, max {args.max_new_tokens} new tokens, {tokens} written in all; "
          f"median of {args.rounds} alternating rounds")
    for label, seconds in (("one batch, rows together", t_together),
                           (f"{args.batch} calls one after another", t_apart),
                           ("one batch, batched=False", t_inside)):
        print(f"  {label:32s} {seconds:7.2f} s  {tokens / seconds:7.1f} tokens/s")
    print(f"  rows together: {t_apart / t_together:.2f}x the calls one after another")
    # A batched pass rounds differently from a one-row pass: in bfloat16 a near-tie may break
    # the other way (model.generate's batches do the same); rows apart are the calls' tokens.
    print(f"  rows equal to the single calls: together {same['together']}/{args.batch}, "
          f"batched=False {same['inside']}/{args.batch}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
