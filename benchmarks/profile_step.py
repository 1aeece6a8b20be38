"""Where a lookahead step's time goes, besides the model's own arithmetic.

Runs ``lookahead.decode.Decoder`` on a HumanEval prompt with an observer that times each phase
of its steps (propose, tree, layout, forward, verify, commit, update, keep: ``Decoder``'s
``observer``) and prints the median microseconds per step of each; then times the forward pass
itself three ways (our 4D mask, no mask = causal, and one token) to show what the mask costs
inside the model.

    python benchmarks/profile_step.py --threads 2
    python benchmarks/profile_step.py --model qwen2.5-coder-0.5b --shape 7x5x7 --steps 60
    python benchmarks/profile_step.py --pyinstrument      # also a call tree of whole steps
    python benchmarks/profile_step.py --model qwen2.5-coder-1.5b --packed --shape 2x4x2 \
        --lookup-tokens 4 --token-cost 0.255 --datastore stdlib --steps 120   # as benchmarked

The comparison scripts that were runs of ``lookahead bench`` or ``loadtest`` are gone; their
figures come from these commands (one run per variant, then compare the results.json files):

    lookahead bench --model smollm2-135m --dataset humaneval --limit 10 --threads 2 \
        --baseline-dtypes bfloat16,float32 --methods hf,autoregressive,lookahead,prompt_lookup
        # bench_quick.py
    lookahead bench --methods hf,lookahead --lookup-tokens 8   (and 16, 24; prompt lookup:
        --methods hf,prompt_lookup --prompt-lookup-tokens K)    # copy_length.py
    lookahead bench --dtype float32 --packed-weights --baseline-dtypes float32
        # packed_float32.py: bench checks packed float32 against plain
    lookahead bench --methods hf,lookahead --shape auto   (and --shape 2x5x4)
        # tuned_vs_default.py
    lookahead bench --methods hf,draft --draft-model NAME --draft-tokens K   (per K)
        # draft_tokens.py
    lookahead serve --model smollm2-135m --step-token-budget B &
    lookahead loadtest --concurrency 1,8 --methods lookahead,autoregressive --requests 8 \
        --max-tokens 128        # loadtest_engine.py (over HTTP, per budget B)
    window_gauge.py (the window at every step against the gauged one) has no bench flag; the
    gauge's choice is checked in tests/unit/test_proposers_lookahead.py.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

from lookahead.api import make_decoder
from lookahead.attention import attention_mask
from lookahead.bench.datasets import encode_prompt, load_prompts
from lookahead.cache import cache_keyword, cache_length
from lookahead.cli.bench_args import apply_threads, positive_int, shape_arg
from lookahead.models.load import load_model
from lookahead.sources.datastore import load_datastore


class Clock:
    """Accumulates microseconds per phase of the current step: ``lap`` is the observer."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.last = time.perf_counter()

    def restart(self) -> None:
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.samples[phase].append(1e6 * (now - self.last))
        self.last = now


@torch.inference_mode()
def profile_phases(model, input_ids, shape, steps: int, **options) -> dict[str, list[float]]:
    """Median µs per phase over ``steps`` steps; ``options`` go to ``make_decoder`` as given
    (``lookup_tokens``, ``token_cost``, ``datastore``, ...)."""
    decoder = make_decoder(
        model, input_ids, steps * 8, "lookahead",
        window=shape[0], ngram=shape[1], guess=shape[2], **options,
    )  # fmt: skip
    stepping = iter(decoder)
    next(stepping)  # the prefill, untimed
    clock = Clock()
    decoder.observer = clock.lap
    for _ in range(steps):
        if decoder.finished:
            break
        clock.restart()
        next(stepping)
    clock.samples["(forward tokens T)"] = decoder.stats.forward_tokens_per_step[1:]
    clock.samples["(cache length)"] = [cache_length(decoder.cache)]
    clock.samples["(tokens per step)"] = [decoder.stats.tokens_per_step]
    return clock.samples


@torch.inference_mode()
def forward_variants(model, input_ids, shape, repeats: int = 15) -> dict[str, float]:
    """Median µs of one step-sized forward: with a 4D lookahead-shaped mask, without a mask
    (plain causal), and of one token, on a cache as long as the prompt."""
    from transformers import DynamicCache

    cache = DynamicCache()
    keyword = cache_keyword(model)
    model(input_ids=input_ids, **{keyword: cache}, use_cache=True, logits_to_keep=1)
    past = cache_length(cache)
    window, ngram, guess = shape
    t = 1 + window * (ngram - 1) + guess * (ngram - 1) // 2  # a typical step
    ids = input_ids[:, :t] if input_ids.shape[1] >= t else input_ids[:, :1].repeat(1, t)
    positions = torch.arange(past, past + t).unsqueeze(0)
    visible = torch.tril(torch.ones(t, t, dtype=torch.bool))
    mask = attention_mask(model.config, visible, past, positions, model.dtype)
    keep = torch.arange(t // 2)
    variants = {
        f"forward T={t}, 4D mask, logits of {t // 2} rows": (ids, positions, mask, keep),
        f"forward T={t}, no mask (causal), logits of {t // 2} rows": (ids, positions, None, keep),
        "forward T=1 (plain decoding step)": (ids[:, :1], positions[:, :1], None, 1),
    }
    medians = {}
    for name, (x, pos, m, k) in variants.items():
        times = []
        for _ in range(repeats + 2):
            start = time.perf_counter()
            model(input_ids=x, position_ids=pos, attention_mask=m, **{keyword: cache},
                  use_cache=True, logits_to_keep=k)  # fmt: skip
            times.append(1e6 * (time.perf_counter() - start))
            cache.crop(-x.shape[1])
        medians[name] = statistics.median(times[2:])
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto", help="(default: auto, as the commands)")
    parser.add_argument("--shape", type=shape_arg, default=(7, 5, 7))
    parser.add_argument("--prompt", type=int, default=0, help="HumanEval index (0)")
    parser.add_argument("--steps", type=positive_int, default=40)
    parser.add_argument("--threads", type=positive_int)
    parser.add_argument("--packed", action="store_true", help="pack the linear layers")
    parser.add_argument("--lookup-tokens", type=int, help="L, copied tokens (default: the library's)")
    parser.add_argument("--token-cost", type=float, help="(default: the library's)")
    parser.add_argument("--datastore", help="stdlib or a path, as the commands take")
    parser.add_argument("--pyinstrument", action="store_true")
    args = parser.parse_args(argv)
    apply_threads(args.threads)
    model, tokenizer = load_model(args.model, args.dtype, packed_weights=args.packed)
    prompt = load_prompts("humaneval", args.prompt + 1)[args.prompt]
    input_ids = encode_prompt(tokenizer, prompt)
    options = {
        name: value
        for name, value in (("lookup_tokens", args.lookup_tokens), ("token_cost", args.token_cost))
        if value is not None
    }
    if args.datastore:
        options["datastore"] = load_datastore(args.datastore, tokenizer)
    profile_phases(model, input_ids, args.shape, 5, **options)  # warm-up
    samples = profile_phases(model, input_ids, args.shape, args.steps, **options)
    steps = len(samples["forward"])
    print(
        f"{args.model} {str(model.dtype).removeprefix('torch.')}, W,N,G={args.shape}, "
        f"{torch.get_num_threads()} threads, "
        f"prompt {prompt.id} ({input_ids.shape[1]} tokens), {steps} steps"
    )
    for phase, values in samples.items():
        if phase.startswith("("):
            print(f"  {phase:58s} median {statistics.median(values):8.1f}")
        else:
            print(f"  {phase:58s} median {statistics.median(values):8.0f} µs  "
                  f"mean {statistics.fmean(values):8.0f} µs")  # fmt: skip
    for name, micros in forward_variants(model, input_ids, args.shape).items():
        print(f"  {name:58s} median {micros:8.0f} µs")
    if args.pyinstrument:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        with profiler:
            profile_phases(model, input_ids, args.shape, args.steps, **options)
        print(profiler.output_text(unicode=True, color=False, show_all=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
