"""What a forward pass of k new tokens costs on this CPU, by dtype, by linear kernel, and per step.

Lookahead pays where a pass of many tokens costs little more than a pass of one. ``--times``
chooses what is timed, in alternating rounds (so that a slow spell of a shared machine hits
every variant alike), medians:

- ``dtypes`` (the default): the model in each of ``--dtypes``, the median cost of a pass of k
  new tokens after a HumanEval prompt (``lookahead.bench.cost_curve.forward_cost_curve``), and
  which dtype ``"auto"`` picks here (``lookahead.models.registry.preferred_dtype``).
- ``packing``: the same curve on plain weights against packed ones (``lookahead.kernels.packing``;
  with ``--stream-kernel`` also ``lookahead.kernels.stream_linear``); then the largest logit
  difference against plain over every k (0 in bfloat16: bit for bit), for scale how far each
  model's logits move when the largest k tokens go in one pass rather than one by one, and
  whether HF ``generate`` writes the same tokens on each, and how fast.
- ``quant``: every linear of a GGUF model (each layer's q, k, v, o, gate, up, down; not
  attention, not the output head) as ``QuantLinear``, for k token rows, beside the memory
  floor (the packed bytes over ``--bandwidth`` GB/s) and llama.cpp's small-batch curve
  (llama-bench on this CPU), for each ``--tiles`` and each prefetch distance of ``--ahead``
  (``QuantLinear.ahead``). CPU ms is the process's: on a busy machine wall time waits.
- ``torch-ops``: PyTorch's own int8 / int4 / bfloat16 / float32 products for one 8960 x 1536
  weight against ``QuantLinear`` Q4_K, k rows of float32.
- ``step``: where a lookahead step's time goes besides the model's arithmetic: ``Decoder``'s
  ``observer`` times each phase of its steps (propose, tree, layout, forward, verify, commit,
  update, keep), then the forward pass itself is timed with our 4D mask, with none (causal)
  and for one token, to show what the mask costs inside the model.

    python benchmarks/forward_cost.py --threads 2 --plot docs/results/forward-cost.png
    python benchmarks/forward_cost.py --times packing --model qwen2.5-coder-1.5b --threads 2 \
        --plot docs/results/packed-weights-qwen2.5-coder-1.5b.png       # add --stream-kernel
    python benchmarks/forward_cost.py --times packing --dtype float32 --threads 2  # AVX2 only
    PYTHONPATH=$PWD/src python -m lookahead install-model qwen2.5-coder-1.5b   # once, then
    PYTHONPATH=$PWD/src python benchmarks/forward_cost.py --times quant --rounds 5 \
        --tokens 1,2,4,6,8,12 --threads 1
    python benchmarks/forward_cost.py --times quant --rounds 9 --tokens 1,2,4,8 --threads 2 \
        --ahead 1024 2048 3072 4096 8192 4096/512 \
        --gguf ~/.cache/lookahead/gguf/qwen2.5-coder-1.5b.gguf
    PYTHONPATH=$PWD/src python benchmarks/forward_cost.py --times torch-ops --rounds 5 \
        --tokens 1,2,4,8 --threads 1
    python benchmarks/forward_cost.py --times step --threads 2      # --pyinstrument: call tree
    python benchmarks/forward_cost.py --times step --model qwen2.5-coder-1.5b --packed \
        --shape 2x4x2 --lookup-tokens 4 --token-cost 0.255 --datastore stdlib --steps 120
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

import lookahead
from lookahead.request import make_decoder
from lookahead.attention import attention_mask
from lookahead.bench.cost_curve import forward_cost_curve
from lookahead.bench.datasets import encode_prompt, load_prompts
from lookahead.cache import cache_keyword, cache_length, new_cache
from lookahead.cli.bench_args import (
    apply_threads,
    dtype_list,
    positive_int,
    positive_int_list,
    quiet_loading,
    shape_arg,
)
from lookahead.kernels.prefetch import Prefetch
from lookahead.models.registry import AUTO_DTYPE, dtype_name

TIMES = ("dtypes", "packing", "quant", "torch-ops", "step")
DEFAULT_TOKENS = {"dtypes": (1, 2, 4, 8, 16, 32, 64), "packing": (1, 2, 4, 8, 16, 32),
                  "quant": (1, 2, 4, 6, 8, 12), "torch-ops": (1, 2, 4, 6, 8, 12)}
GGUF = Path.home() / ".cache" / "lookahead" / "gguf" / "qwen2.5-coder-1.5b.gguf"
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
LLAMA_CPP = {1: 1.0, 2: 1.5, 4: 2.4, 8: 5.1}  # llama-bench, times one row, on this CPU


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--times", choices=TIMES, default="dtypes", help="what to time (default: dtypes)")
    add("--model", default="smollm2-135m")
    add("--threads", type=positive_int, help="torch threads (default: torch's)")
    add("--tokens", type=positive_int_list, help="pass sizes (rows) k, e.g. 1,2,4,8")
    add("--repeats", type=positive_int, default=3, help="passes per round")
    add("--rounds", type=positive_int, default=3, help="alternating rounds")
    add("--plot", type=Path, help="dtypes, packing: save the curves as this PNG")
    add("--dtypes", type=dtype_list, default=("float32", "bfloat16"),
        help="dtypes: comma-separated (default: float32,bfloat16)")
    add("--dtype", help="packing: bfloat16 (default) or float32; step: as the commands (auto)")
    add("--stream-kernel", action="store_true", help="packing: also the stream kernel")
    add("--max-new-tokens", type=positive_int, default=64, help="packing: HF generate's")
    add("--gguf", type=Path, default=GGUF, help="quant, torch-ops: the GGUF file")
    add("--tiles", type=int, nargs="+", default=[0],
        help="quant: rows per weight read to try (0: the kernel's default)")
    add("--ahead", type=prefetch_setting, nargs="+", default=[None],
        help="quant: prefetch settings to try: bytes ahead to L1 (2048), or to L2 and to "
             "L1 (4096/512) (default: the kernel's)")
    add("--layers", type=positive_int, help="quant: only the first layers")
    add("--bandwidth", type=float, default=33.0, help="quant: GB/s for the floor")
    add("--shape", type=shape_arg, default=(7, 5, 7), help="step: WxNxG")
    add("--prompt", type=int, default=0, help="step: HumanEval index (0)")
    add("--steps", type=positive_int, default=40, help="step: steps timed")
    add("--packed", action="store_true", help="step: pack the linear layers")
    add("--lookup-tokens", type=int, help="step: L, copied tokens (default: the library's)")
    add("--token-cost", type=float, help="step: (default: the library's)")
    add("--datastore", help="step: stdlib or a path, as the commands take")
    add("--pyinstrument", action="store_true", help="step: also a call tree of whole steps")
    args = parser.parse_args(argv)
    args.tokens = list(args.tokens or DEFAULT_TOKENS.get(args.times, ()))
    return args


# --- dtypes and packing: whole-model curves -------------------------------------------------

def load_settings(args, settings: dict[str, dict]) -> tuple[dict, object, torch.Tensor]:
    """Load ``args.model`` once per setting (name -> ``load_model`` keywords); return (models
    by name, the tokenizer, the first HumanEval prompt [1, L])."""
    quiet_loading(args)
    models = {}
    for name, options in settings.items():
        models[name], tokenizer = lookahead.load_model(args.model, **options)
    return models, tokenizer, encode_prompt(tokenizer, load_prompts("humaneval", 1)[0])


def curves(models: dict, prompt: torch.Tensor, args) -> dict[str, list]:
    """Median seconds per k for each model, over ``args.rounds`` alternating rounds."""
    seconds: dict[str, list[list[float]]] = {name: [] for name in models}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, model in models.items():
                seconds[name].append(
                    forward_cost_curve(model, prompt, args.tokens, args.repeats)["seconds"])
    return {name: [statistics.median(r[i] for r in rounds) for i in range(len(args.tokens))]
            for name, rounds in seconds.items()}


def print_curves(costs: dict[str, list], args, setting: str, ratios: bool) -> None:
    """The curves as a Markdown table (with plain / other ratios if ``ratios``), and a PNG."""
    print(f"{setting}; median ms of a forward pass of k new tokens ({args.rounds} rounds of "
          f"{args.repeats})\n")
    if args.plot:
        plot(costs, args.tokens, setting, args.plot)
    first, names = next(iter(costs)), list(costs)
    others = names[1:] if ratios else []
    print("| k | " + " | ".join(f"{name} ms" for name in names)
          + "".join(f" | {first} / {name}" for name in others) + " |")
    print("|--:" * (1 + len(names) + len(others)) + "|")
    for i, k in enumerate(args.tokens):
        cells = [f"{1000 * costs[name][i]:.1f}" for name in names]
        cells += [f"{costs[first][i] / costs[name][i]:.2f}x" for name in others]
        print(f"| {k} | " + " | ".join(cells) + " |")


def plot(costs: dict[str, list], tokens: list[int], title: str, path: Path) -> None:
    """The curves, ms against k, as a PNG at ``path``."""
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


def time_dtypes(args) -> None:
    """``--times dtypes``: the curve in each dtype."""
    models, _, prompt = load_settings(args, {d: {"dtype": d} for d in args.dtypes})
    costs = curves(models, prompt, args)
    setting = (f"{args.model}, {torch.get_num_threads()} threads, {prompt.shape[1]}-token "
               f"prompt, {platform.processor() or platform.machine()}, "
               f"{torch.backends.cpu.get_cpu_capability()}")
    print_curves(costs, args, setting, ratios=False)
    print(f"\ndtype 'auto' is {dtype_name(AUTO_DTYPE)} here")


@torch.inference_mode()
def logit_difference(models: dict, prompt: torch.Tensor, tokens: list[int]) -> float:
    """The largest absolute difference between two models' logits over a prefill and then a
    pass of each k (0.0: the same bit for bit)."""
    outputs = []
    for model in models.values():
        cache = {cache_keyword(model): new_cache()}
        logits = [model(input_ids=prompt, **cache).logits]
        logits += [model(input_ids=prompt[:, :k], **cache).logits for k in tokens]
        outputs.append(logits)
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(*outputs, strict=True))


@torch.inference_mode()
def pass_size_difference(model, prompt: torch.Tensor, k: int) -> float:
    """The largest absolute difference between ``model``'s logits for k tokens after
    ``prompt`` fed in one pass and fed one by one: what verifying k tokens at once changes
    against decoding them, on the same weights."""
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


def timed_generate(model, prompt: torch.Tensor, max_new_tokens: int) -> tuple[list[int], float]:
    """HF ``generate``'s greedy new tokens and their tokens/s (after an 8-token warm-up)."""
    model.generate(prompt, max_new_tokens=8, do_sample=False)
    started = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
    new = out[0, prompt.shape[1]:].tolist()
    return new, len(new) / (time.perf_counter() - started)


def time_packing(args) -> None:
    """``--times packing``: plain against packed (and stream) weights: curves, logits, generate."""
    dtype = args.dtype or "bfloat16"
    settings = {"plain": {"dtype": dtype, "packed_weights": False},
                "packed": {"dtype": dtype, "packed_weights": True}}
    if args.stream_kernel:
        settings["stream"] = {"dtype": dtype, "packed_weights": "stream"}
    models, tokenizer, prompt = load_settings(args, settings)
    for model in models.values():
        model.generation_config.pad_token_id = tokenizer.eos_token_id
    costs = curves(models, prompt, args)
    print_curves(costs, args, f"{args.model} {dtype}, {torch.get_num_threads()} threads, "
                 f"{prompt.shape[1]}-token prompt", ratios=True)
    others = [name for name in models if name != "plain"]
    for name in others:
        difference = logit_difference({"plain": models["plain"], name: models[name]}, prompt,
                                      args.tokens)
        print(f"\nlargest logit difference, plain against {name}, over every k: "
              f"{difference:.3g}")
    k = max(args.tokens)
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


# --- quant and torch-ops: the quantized linear layers ---------------------------------------

def load_linears(path: Path, layers: int | None) -> list:
    """The first ``layers`` (default: every) layers' seven linears as QuantLinear, in order."""
    import gguf

    from lookahead.kernels.quant_linear import QuantLinear

    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    count = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("blk."))
    modules = []
    for layer in range(count if layers is None else layers):
        for name in LINEARS:
            t = tensors[f"blk.{layer}.{name}.weight"]
            bias = tensors.get(f"blk.{layer}.{name}.bias")
            modules.append(QuantLinear(
                torch.from_numpy(np.array(t.data)), int(t.tensor_type), int(t.shape[0]),
                None if bias is None else torch.from_numpy(np.array(bias.data))))
    return modules


def time_rounds(run, keys: list, args, repeat: int) -> tuple[dict, dict]:
    """(wall ms, process CPU ms) per call of ``run(key)`` for each key, keys taken in turn
    within each of ``args.rounds`` rounds (on a busy machine, wall time waits for others)."""
    wall: dict = {key: [] for key in keys}
    cpu: dict = {key: [] for key in keys}
    for _ in range(args.rounds):
        for key in keys:
            run(key)  # warm: caches, threads
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(repeat):
                run(key)
            wall[key].append((time.perf_counter() - start) / repeat * 1e3)
            cpu[key].append((time.process_time() - start_cpu) / repeat * 1e3)
    return wall, cpu


def prefetch_setting(text: str) -> Prefetch:
    """``--ahead``: "2048" (bytes ahead, to L1) or "4096/512" (to L2, and to L1)."""
    try:
        return Prefetch(*(int(part) for part in text.split("/", 1)))
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected bytes ahead (2048) or L2/L1 bytes ahead (4096/512), got {text!r}: "
            f"{error}") from None


def time_quant(args) -> None:
    """``--times quant``: every linear of the GGUF model for k rows, each tile setting and
    prefetch distance (``--ahead``)."""
    modules = load_linears(args.gguf, args.layers)
    size = sum(m.records.numel() for m in modules)
    floor = size / args.bandwidth / 1e6
    inputs = {k: {m.in_features: torch.randn(k, m.in_features) for m in modules}
              for k in args.tokens}
    default = Prefetch(modules[0].ahead, modules[0].near)

    def run(key: tuple[int, int, Prefetch | None]) -> None:
        k, tile, ahead = key
        setting = default if ahead is None else ahead
        for m in modules:
            m.tile, m.ahead, m.near = tile, setting.ahead, setting.near
            m(inputs[k][m.in_features])

    keys = [(k, tile, ahead) for ahead in args.ahead for tile in args.tiles
            for k in args.tokens]
    times, cpu = time_rounds(run, keys, args, args.repeats)
    print(f"{len(modules)} linears, {size / 2**30:.3f} GiB packed, floor {floor:.1f} ms at "
          f"{args.bandwidth:g} GB/s; {torch.get_num_threads()} threads, "
          f"{modules[0].extra_repr().split(', ')[-1]}; {args.rounds} rounds")
    print("    ahead tile rows  median ms  (min - max)     x 1 row  llama.cpp  CPU ms")
    for k, tile, ahead in keys:
        med = statistics.median(times[k, tile, ahead])
        one = statistics.median(times[args.tokens[0], tile, ahead])
        ref = f"{LLAMA_CPP[k]:.1f}" if k in LLAMA_CPP else ""
        shown = default if ahead is None else ahead
        shown = f"{shown.ahead}/{shown.near}" if shown.near else str(shown.ahead)
        print(f"{shown:>9s} {tile:4d} {k:4d}  {med:9.1f}  ({min(times[k, tile, ahead]):6.1f} - "
              f"{max(times[k, tile, ahead]):6.1f})  {med / one:7.2f}  {ref:>9s}  "
              f"{statistics.median(cpu[k, tile, ahead]):6.1f}")


def torch_products(path: Path) -> dict:
    """PyTorch's CPU products for one [8960, 1536] weight and QuantLinear Q4_K: name -> call.
    The Q4_K blocks are the real model's first gate rows (``gguf.quants`` cannot quantize
    Q4_K): the cost depends on the shape, not on the values."""
    import gguf

    from lookahead.kernels.quant_linear import QuantLinear

    torch.manual_seed(0)
    out, width, group = 8960, 1536, 32
    w = torch.randn(out, width) * 0.02
    linear = torch.nn.Linear(width, out, bias=False)
    linear.weight.data = w.clone()
    dynamic = torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(linear), {torch.nn.Linear}, dtype=torch.qint8)
    scale8 = w.abs().amax(1) / 127
    w8 = torch.round(w / scale8[:, None]).to(torch.int8)
    grouped = w.reshape(out, -1, group)
    low, high = grouped.amin(-1), grouped.amax(-1)
    scale4 = (high - low).clamp(min=1e-8) / 15
    q4 = torch.round((grouped - low[..., None]) / scale4[..., None]).clamp(0, 15)
    q4 = q4.to(torch.int32).reshape(out, width)
    # torch's convention: w = (q - 8) * scale + zero
    scales_zeros = torch.stack([scale4.t(), (low + 8 * scale4).t()], -1).contiguous()
    packed4 = torch._convert_weight_to_int4pack_for_cpu(q4, 1)
    wb = w.bfloat16()
    gate = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.ffn_gate.weight")
    return {
        "bfloat16 F.linear": lambda x: torch.nn.functional.linear(x.bfloat16(), wb),
        "float32 F.linear": lambda x: torch.nn.functional.linear(x, w),
        "dynamic int8 (FBGEMM)": dynamic,
        "_weight_int8pack_mm": lambda x: torch._weight_int8pack_mm(
            x.bfloat16(), w8, scale8.bfloat16()),
        "_weight_int4pack_mm_for_cpu g32": lambda x: torch._weight_int4pack_mm_for_cpu(
            x.bfloat16(), packed4, group, scales_zeros.bfloat16()),
        "QuantLinear Q4_K": QuantLinear(torch.from_numpy(np.array(gate.data)[:out]), 12, width),
    }


def time_torch_ops(args) -> None:
    """``--times torch-ops``: ms per call of each product for k rows."""
    inputs = {k: torch.randn(k, 1536) for k in args.tokens}
    print(f"[8960, 1536] weight, {torch.get_num_threads()} threads, rows {args.tokens}: "
          f"ms per call (median of {args.rounds} rounds), x 1 row, CPU ms per call")
    for name, fn in torch_products(args.gguf).items():
        times, cpu = time_rounds(lambda k, fn=fn: fn(inputs[k]), args.tokens, args,
                                 args.repeats * 4)
        med = [statistics.median(times[k]) for k in args.tokens]
        print(f"{name:32s}" + "".join(f" {v:7.3f}" for v in med) + "  x"
              + " ".join(f"{v / med[0]:.2f}" for v in med) + "  CPU"
              + "".join(f" {statistics.median(cpu[k]):.3f}" for k in args.tokens))


# --- step: a lookahead step's phases, through Decoder's observer ----------------------------

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
    """µs per phase of each of ``steps`` steps; ``options`` go to ``make_decoder`` as given
    (``lookup_tokens``, ``token_cost``, ``datastore``, ...)."""
    decoder = make_decoder(model, input_ids, steps * 8, "lookahead",
                           window=shape[0], ngram=shape[1], guess=shape[2], **options)
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

    cache, keyword = DynamicCache(), cache_keyword(model)
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
                  use_cache=True, logits_to_keep=k)
            times.append(1e6 * (time.perf_counter() - start))
            cache.crop(-x.shape[1])
        medians[name] = statistics.median(times[2:])
    return medians


def time_step(args) -> None:
    """``--times step``: the phases' median µs per step, then the forward variants."""
    from lookahead.sources.datastore import load_datastore

    dtype = {"dtype": args.dtype} if args.dtype else {}  # none: as the commands load it
    model, tokenizer = lookahead.load_model(args.model, **dtype,
                                            packed_weights=args.packed or None)
    prompt = load_prompts("humaneval", args.prompt + 1)[args.prompt]
    input_ids = encode_prompt(tokenizer, prompt)
    options = {name: value for name, value in (("lookup_tokens", args.lookup_tokens),
                                               ("token_cost", args.token_cost))
               if value is not None}
    if args.datastore:
        options["datastore"] = load_datastore(args.datastore, tokenizer)
    profile_phases(model, input_ids, args.shape, 5, **options)  # warm-up
    samples = profile_phases(model, input_ids, args.shape, args.steps, **options)
    print(f"{args.model} {str(model.dtype).removeprefix('torch.')}, W,N,G={args.shape}, "
          f"{torch.get_num_threads()} threads, prompt {prompt.id} ({input_ids.shape[1]} "
          f"tokens), {len(samples['forward'])} steps")
    for phase, values in samples.items():
        if phase.startswith("("):
            print(f"  {phase:58s} median {statistics.median(values):8.1f}")
        else:
            print(f"  {phase:58s} median {statistics.median(values):8.0f} µs  "
                  f"mean {statistics.fmean(values):8.0f} µs")
    by_size: dict[int, list[float]] = defaultdict(list)  # the forward pass by its tokens
    for size, micros in zip(samples["(forward tokens T)"], samples["forward"]):
        by_size[size].append(micros)
    one = statistics.median(by_size[1]) if by_size.get(1) else None
    for size in sorted(by_size):
        ratio = f"  {statistics.median(by_size[size]) / one:5.2f}x T=1" if one else ""
        print(f"  {f'forward of T={size} ({len(by_size[size])} steps)':58s} median "
              f"{statistics.median(by_size[size]):8.0f} µs{ratio}")
    for name, micros in forward_variants(model, input_ids, args.shape).items():
        print(f"  {name:58s} median {micros:8.0f} µs")
    if args.pyinstrument:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        with profiler:
            profile_phases(model, input_ids, args.shape, args.steps, **options)
        print(profiler.output_text(unicode=True, color=False, show_all=False))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    apply_threads(args.threads)
    {"dtypes": time_dtypes, "packing": time_packing, "quant": time_quant,
     "torch-ops": time_torch_ops, "step": time_step}[args.times](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
