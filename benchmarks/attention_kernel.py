"""The row-invariant attention kernel against another commit's, in one process, alternating.

    python benchmarks/attention_kernel.py --against 3bf6613
    python benchmarks/attention_kernel.py --against 3bf6613 --model smollm2-135m \\
        --dataset benchmarks/task-groups-12.jsonl --limit 12 --max-new-tokens 128

The other commit's ``csrc/invariant_attention.cpp`` (with the headers it includes) is built
as an extension of its own name beside this checkout's. Per shape (heads, key/value heads,
head size, cached keys, query rows: a decoding step's, causal over the cache) each kernel is
timed in turn, ``--rounds`` rounds of 40 calls, and the median of each round's median is
printed, with how far their outputs differ.

With ``--model``, each prompt is then decoded autoregressively and with lookahead on each
kernel in turn (the first of the pair alternating), the model's attention calls going to the
kernel under test: ``invariant_attention`` looks its kernel up through
``load_attention_kernel``, which this script points at one build, then the other.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

from lookahead import generate
from lookahead.bench.datasets import encode_prompt, load_prompts
from lookahead.kernels import invariant_attention
from lookahead.kernels.build import compile_kernel
from lookahead.kernels.quant_linear import ISA_FLAGS, best_isa
from lookahead.models.load import load_model

REPO = Path(__file__).resolve().parents[1]
CSRC = "src/lookahead/kernels/csrc"
# (heads, key/value heads, head size): SmolLM2-135M's, Qwen2.5-Coder-1.5B's
SHAPES = ((9, 3, 64), (12, 2, 128))


def kernel_at(commit: str, folder: Path) -> ModuleType:
    """``commit``'s attention kernel, built for this CPU under a name of its own.

    Raises:
        subprocess.CalledProcessError: git knows no such commit, or no kernel in it.
    """
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", commit],
                            check=True, capture_output=True, text=True).stdout.strip()
    for name in ("invariant_attention.cpp", "exp_approx.h", "aten_light.h"):
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{CSRC}/{name}"],
                              check=True, capture_output=True).stdout
        (folder / name).write_bytes(text)
    isa = best_isa()
    return compile_kernel(f"attention_at_{commit}_{isa}", [folder / "invariant_attention.cpp"],
                          ["-O3", "-ffp-contract=off", *ISA_FLAGS[isa], "-mfma"],
                          headers=(folder / "exp_approx.h", folder / "aten_light.h"))


def shape_inputs(heads: int, kv_heads: int, dim: int, keys: int, rows: int):
    """query [1, H, T, D], key and value [1, Hkv, S, D], additive mask [1, T, S]: a step's
    ``rows`` new tokens, causal among themselves, after ``keys - rows`` cached ones."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, heads, rows, dim, generator=generator)
    key = torch.randn(1, kv_heads, keys, dim, generator=generator)
    value = torch.randn(1, kv_heads, keys, dim, generator=generator)
    allowed = torch.ones(1, rows, keys, dtype=torch.bool).tril(keys - rows)
    mask = torch.zeros(1, rows, keys).masked_fill(~allowed, float("-inf"))
    return query, key, value, mask


def call_us(kernel: ModuleType, inputs: tuple) -> float:
    """Median microseconds of 40 calls of ``kernel.attend(*inputs)``, after 5 to warm up."""
    for _ in range(5):
        kernel.attend(*inputs)
    calls = []
    for _ in range(40):
        start = time.perf_counter()
        kernel.attend(*inputs)
        calls.append(time.perf_counter() - start)
    return statistics.median(calls) * 1e6


def time_shapes(kernels: dict[str, ModuleType], keys: list[int], rows: list[int],
                rounds: int) -> list[str]:
    """One line per shape: each kernel's microseconds a call, and their largest difference."""
    lines, totals = [], dict.fromkeys(kernels, 0.0)
    for (heads, kv_heads, dim), length, count in itertools.product(SHAPES, keys, rows):
        inputs = (*shape_inputs(heads, kv_heads, dim, length, count), False, dim ** -0.5)
        rounds_us = [[call_us(kernel, inputs) for kernel in kernels.values()]
                     for _ in range(rounds)]
        medians = dict(zip(kernels, map(statistics.median, zip(*rounds_us))))
        outputs = [kernel.attend(*inputs) for kernel in kernels.values()]
        gap = (outputs[0] - outputs[-1]).abs().max().item()
        for name, us in medians.items():
            totals[name] += us
        cells = "  ".join(f"{name} {us:7.1f} us" for name, us in medians.items())
        lines.append(f"{heads:2d} heads / {kv_heads} kv, D {dim:3d}, {length:5d} keys, "
                     f"{count} rows:  {cells}  max diff {gap:.1e}")
    lines.append("sum over shapes:  " + "  ".join(f"{n} {t:.0f} us" for n, t in totals.items()))
    return lines


def decode(kernels: dict[str, ModuleType], model, tokenizer, prompts,
           max_new_tokens: int) -> list[str]:
    """Per kernel and method, tok/s over the prompts, each prompt on both kernels in turn."""
    tokens: dict[tuple[str, str], int] = {}
    seconds: dict[tuple[str, str], float] = {}
    lookup = invariant_attention.load_attention_kernel
    try:
        for index, prompt in enumerate(prompts):
            ids = encode_prompt(tokenizer, prompt)
            for name in list(kernels) if index % 2 == 0 else list(reversed(kernels)):
                invariant_attention.load_attention_kernel = lambda kernel=kernels[name]: kernel
                for method in ("autoregressive", "lookahead"):
                    start = time.perf_counter()
                    out = generate(model, ids, max_new_tokens, method, do_sample=False)
                    key = (name, method)
                    seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start
                    tokens[key] = tokens.get(key, 0) + out.sequences.shape[1] - ids.shape[1]
    finally:
        invariant_attention.load_attention_kernel = lookup
    return [f"{name:10s} {method:15s} {tokens[name, method] / seconds[name, method]:7.2f} tok/s"
            for name in kernels for method in ("autoregressive", "lookahead")]


def sizes(text: str) -> list[int]:
    """'300,1000' -> [300, 1000], each positive."""
    values = [int(part) for part in text.split(",")]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,4,6, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the commit whose kernel to time")
    parser.add_argument("--keys", type=sizes, default=[300, 1000])
    parser.add_argument("--rows", type=sizes, default=[1, 4, 6])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="also decode with it (a name load_model takes)")
    parser.add_argument("--dataset", default="benchmarks/task-groups-12.jsonl")
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds: expected a positive number, got {args.rounds}")
    torch.set_num_threads(args.threads)
    prompts = None
    if args.model is not None:
        try:
            prompts = load_prompts(args.dataset, limit=args.limit)
            model, tokenizer = load_model(args.model)[:2]
        except ValueError as error:
            parser.error(str(error))
    with tempfile.TemporaryDirectory() as folder:
        try:
            other = kernel_at(args.against, Path(folder))
        except subprocess.CalledProcessError:
            parser.error(f"--against: no attention kernel at {args.against!r} in {REPO}")
    kernels = {args.against: other, "this": invariant_attention.load_attention_kernel()}
    for line in time_shapes(kernels, args.keys, args.rows, args.rounds):
        print(line, flush=True)
    if prompts is not None:
        for line in decode(kernels, model, tokenizer, prompts, args.max_new_tokens):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
