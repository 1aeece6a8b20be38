"""Packed weights against plain ones: the forward-cost curve, and how far the logits differ.

Loads the model twice in ``--dtype`` (bfloat16 by default, or float32), once with its linear
linear layers packed (``lookahead.kernels.packing``: laid out for oneDNN in bfloat16, taken
weight first in float32), and measures, in alternating rounds so that
a slow spell of a shared machine hits both alike, the median cost of a forward pass of k new
tokens after a prompt (``lookahead.bench.cost_curve.forward_cost_curve``). Then it prints the largest
difference between their logits over every k (0 in bfloat16: bit for bit); for scale, how far
each model's own logits move when the largest k tokens go in one pass rather than one by one;
and whether HF ``generate`` writes the same tokens on both, and times it. With
``--stream-kernel`` a third copy runs on the stream kernel (``lookahead.kernels.stream_linear``).

    python benchmarks/packed_weights.py --model qwen2.5-coder-1.5b --threads 2 \
        --plot docs/results/packed-weights-qwen2.5-coder-1.5b.png
    python benchmarks/packed_weights.py --dtype float32 --threads 2   # an AVX2-only CPU
    python benchmarks/packed_weights.py --model qwen2.5-coder-1.5b --threads 2 --stream-kernel
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

import lookahead
from lookahead.cli.bench_args import apply_threads, positive_int, quiet_loading
from lookahead.bench.cost_curve import forward_cost_curve
from lookahead.cache import cache_keyword, new_cache
from lookahead.bench.datasets import encode_prompt, load_prompts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    parser.add_argument("--tokens", default="1,2,4,8,16,32", help="forward sizes k")
    parser.add_argument("--repeats", type=positive_int, default=3, help="passes per round")
    parser.add_argument("--rounds", type=positive_int, default=3, help="alternating rounds")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64,
                        help="tokens HF generate writes on each (default: 64)")
    parser.add_argument("--plot", type=Path, help="save the curves as this PNG")
    parser.add_argument("--stream-kernel", action="store_true",
                        help="also load a copy on the stream kernel (bfloat16; "
                        "lookahead.kernels.stream_linear) and compare it too")
    return parser.parse_args(argv)


def curves(models: dict, prompt: torch.Tensor, tokens: list[int], args) -> dict[str, list]:
    """Median seconds per k for each model, over ``args.rounds`` alternating rounds."""
    seconds: dict[str, list[list[float]]] = {name: [] for name in models}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, model in models.items():
                seconds[name].append(
                    forward_cost_curve(model, prompt, tokens, args.repeats)["seconds"])
    return {name: [statistics.median(r[i] for r in rounds) for i in range(len(tokens))]
            for name, rounds in seconds.items()}


def logit_difference(models: dict, prompt: torch.Tensor, tokens: list[int]) -> float:
    """The largest absolute difference between the two models' logits over a prefill and then
    a pass of each k (0.0: the same bit for bit)."""
    outputs = []
    with torch.inference_mode():
        for model in models.values():
            cache, logits = {cache_keyword(model): new_cache()}, []
            logits.append(model(input_ids=prompt, **cache).logits)
            for k in tokens:
                logits.append(model(input_ids=prompt[:, :k], **cache).logits)
            outputs.append(logits)
    return max((a.float() - b.float()).abs().max().item()
               for a, b in zip(*outputs, strict=True))


def pass_size_difference(model, prompt: torch.Tensor, k: int) -> float:
    """The largest absolute difference between ``model``'s logits for k tokens after
    ``prompt`` fed in one pass and fed one by one: what verifying k tokens at once changes
    against decoding them, on the same weights."""
    with torch.inference_mode():
        runs = []
        for sizes in ([k], [1] * k):
            cache = {cache_keyword(model): new_cache()}
            model(input_ids=prompt, **cache)
            start, logits = 0, []
            for size in sizes:
                logits.append(model(input_ids=prompt[:, start:start + size], **cache).logits)
                start += size
            runs.append(torch.cat(logits, dim=1).float())
    return (runs[0] - runs[1]).abs().max().item()


def plot(costs: dict[str, list], tokens: list[int], title: str, path: Path) -> None:
    """Both curves, ms against k, as a PNG at ``path``."""
    figure = Figure(figsize=(6.0, 4.0), dpi=120)
    axes = figure.add_subplot()
    for name, seconds in costs.items():
        axes.plot(tokens, [1000 * s for s in seconds], "o-", label=f"{name} weights")
    axes.set_xlabel("new tokens k in one forward pass")
    axes.set_ylabel("median latency (ms)")
    axes.set_ylim(bottom=0)
    axes.set_title(title, fontsize=9)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


def timed_generate(model, prompt: torch.Tensor, max_new_tokens: int) -> tuple[list[int], float]:
    """HF ``generate``'s greedy new tokens and their tokens/s (after an 8-token warm-up)."""
    model.generate(prompt, max_new_tokens=8, do_sample=False)
    started = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
    new = out[0, prompt.shape[1]:].tolist()
    return new, len(new) / (time.perf_counter() - started)


def load_settings(args, settings: dict[str, dict]) -> tuple[dict, object, torch.Tensor]:
    """Set the threads, then load ``args.model`` once per setting (name -> ``load_model``
    keywords); return (models by name, the tokenizer, the first HumanEval prompt [1, L])."""
    apply_threads(args.threads)
    quiet_loading(args)
    models = {}
    for name, options in settings.items():
        models[name], tokenizer = lookahead.load_model(args.model, **options)
    return models, tokenizer, encode_prompt(tokenizer, load_prompts("humaneval", 1)[0])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tokens = [int(k) for k in args.tokens.split(",")]
    settings = {"plain": dict(dtype=args.dtype, packed_weights=False),
                "packed": dict(dtype=args.dtype, packed_weights=True)}
    if args.stream_kernel:
        settings["stream"] = dict(dtype=args.dtype, packed_weights="stream")
    models, tokenizer, prompt = load_settings(args, settings)
    for model in models.values():
        model.generation_config.pad_token_id = tokenizer.eos_token_id
    costs = curves(models, prompt, tokens, args)
    setting = (f"{args.model} {args.dtype}, {torch.get_num_threads()} threads, "
               f"{prompt.shape[1]}-token prompt")
    print(f"{setting}; median ms of a forward pass of k new tokens ({args.rounds} rounds of "
          f"{args.repeats})\n")
    if args.plot:
        plot(costs, tokens, setting, args.plot)
    others = [name for name in models if name != "plain"]
    print("| k | " + " | ".join(f"{name} ms" for name in models) + " | "
          + " | ".join(f"plain / {name}" for name in others) + " |")
    print("|--:" * (1 + len(models) + len(others)) + "|")
    for i, k in enumerate(tokens):
        cells = [f"{1000 * costs[name][i]:.1f}" for name in models]
        ratios = [f"{costs['plain'][i] / costs[name][i]:.2f}x" for name in others]
        print(f"| {k} | " + " | ".join(cells + ratios) + " |")
    plain = {"plain": models["plain"]}
    for name in others:
        difference = logit_difference({**plain, name: models[name]}, prompt, tokens)
        print(f"\nlargest logit difference, plain against {name}, over every k: "
              f"{difference:.3g}")
    k = max(tokens)
    print(f"the same weights, {k} tokens in one pass against one by one: "
          + ", ".join(f"{name} {pass_size_difference(m, prompt, k):.3g}"
                      for name, m in models.items()))
    generated = {name: timed_generate(model, prompt, args.max_new_tokens)
                 for name, model in models.items()}
    plain_tokens, plain_speed = generated["plain"]
    print(f"HF generate, {args.max_new_tokens} tokens: plain {plain_speed:.1f} tok/s"
          + "".join(f"; {name} {speed:.1f} tok/s ({speed / plain_speed:.2f}x), same tokens: "
                    f"{new == plain_tokens}" for name, (new, speed) in generated.items()
                    if name != "plain"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
