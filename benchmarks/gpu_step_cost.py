"""The step-cost curve on a GPU: a random-weight model of Llama-2-7B's shape, in bfloat16.

Lookahead turns the spare compute of a forward pass into tokens: it pays where a pass of k
new tokens costs little more than a pass of one. This script measures that curve on a GPU
(``lookahead.bench.cost_curve.forward_cost_curve``: median ms of one forward with k new tokens on a
cached prompt, for a few prompt lengths), then decodes one random prompt with HF ``generate``
(greedy), our autoregressive loop and lookahead at a few shapes (the window at every step,
``token_cost=0``, as on a GPU), and sets each method's ms per step beside the forward-only
cost at its mean step size: the difference is our per-step work (proposer, mask, cache).

Random weights need no download, so the curve is the real one for this shape; what the
decoding accepts is not (a random model's text is no language), so its tokens per step say
nothing of real speed-ups, and the outputs are only checked to be identical to HF's. No test
needs a GPU; this runs anywhere (``--preset tiny`` on a CPU checks the script itself).

    python benchmarks/gpu_step_cost.py --device cuda --out docs/results/gpu-h100
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import textwrap
import time
from pathlib import Path

import torch
import transformers
from matplotlib.figure import Figure
from transformers import LlamaConfig, LlamaForCausalLM

import lookahead
from lookahead.attention import decoding_attention
from lookahead.cli.bench_args import positive_int, positive_int_list, shape_arg
from lookahead.bench.cost_curve import causal_step, cost_at, forward_cost_curve, synchronize
from lookahead.cache import cache_keyword, new_cache

# Llama-2-7B's shape (its config.json); "tiny" keeps the script checkable on a CPU. The
# draft model (for the draft method) takes the target's vocabulary.
PRESETS = {
    "llama-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
    "draft": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", choices=("llama-7b", "tiny"), default="llama-7b")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--contexts", type=positive_int_list, default=(128, 1024),
                        help="cached prompt lengths (default: 128,1024)")
    parser.add_argument("--tokens", type=positive_int_list,
                        default=(1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256, 512),
                        help="forward sizes k (default: 1,2,4,...,512)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed rounds per size")
    parser.add_argument("--shapes", type=lambda t: [shape_arg(s) for s in t.split(",")],
                        default=[(5, 5, 5), (7, 5, 7), (15, 5, 15)],
                        help="lookahead shapes WxNxG, comma-separated")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--passes", type=positive_int, default=2,
                        help="decode with each of our methods this many times in turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm-up", type=float, default=5.0, metavar="SECONDS",
                        help="one-token passes before anything is timed (default: 5)")
    parser.add_argument("--out", type=Path, help="write results.json, curve.md, curve.png here")
    parser.add_argument("--from-results", type=Path, metavar="JSON",
                        help="measure nothing: write the report and plot of this results.json "
                             "(into --out, else beside it)")
    return parser.parse_args(argv)


def build_model(preset: str, dtype: torch.dtype, device: torch.device, seed: int,
                vocab_size: int | None = None):
    """A random-weight Llama of ``preset``'s shape, built on ``device`` (7B's 13 GB of bf16
    weights are drawn there, not on the CPU). No EOS, so every run writes max_new_tokens."""
    shape = PRESETS[preset] | ({} if vocab_size is None else dict(vocab_size=vocab_size))
    config = LlamaConfig(**shape, max_position_embeddings=4096,
                         bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0  # silences generate's warning; never written
    return model


@torch.inference_mode()
def warm_up(model, seconds: float) -> None:
    """Run one-token passes for ``seconds``. On fresh H200 machines, a curve
    measured right after the model was built read 24-30 ms for one token where the steps
    after it took 16-19 (the clocks ramping up, perhaps); this warm-up came after those runs
    and has not been checked on a GPU yet."""
    ids = torch.zeros(1, 1, dtype=torch.long, device=model.device)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        model(input_ids=ids)
        synchronize(model.device)


def measure_curves(model, contexts: list[int], tokens: list[int], repeats: int,
                   generator: torch.Generator) -> dict[int, dict]:
    """Prompt length -> ``forward_cost_curve`` on a random prompt of that length."""
    curves = {}
    for length in contexts:
        prompt = torch.randint(model.config.vocab_size, (1, length), generator=generator)
        curves[length] = forward_cost_curve(model, prompt, tokens, repeats=repeats)
        print(f"curve at {length} cached tokens: "
              + ", ".join(f"{k}:{1000 * s:.1f}" for k, s in zip(tokens, curves[length]["seconds"]))
              + " ms", flush=True)
    return curves


@torch.inference_mode()
def growing_cache_ms(model, prompt: torch.Tensor, k: int, steps: int) -> list[float]:
    """ms of each of ``steps`` forwards of ``k`` causal tokens that stay cached, so that every
    pass meets a cache length it has not met before (the curve re-measures one length). Run it
    under an attention context (``decoding_attention``) to choose the kernels."""
    cache, keyword, device = new_cache(), cache_keyword(model), model.device
    prompt = prompt.to(device)
    model(input_ids=prompt, **{keyword: cache}, use_cache=True, logits_to_keep=1)
    times = []
    for _ in range(steps):
        positions, mask = causal_step(model, cache.get_seq_length(), k)
        synchronize(device)
        start = time.perf_counter()
        model(input_ids=prompt[:, :k], position_ids=positions, attention_mask=mask,
              **{keyword: cache}, use_cache=True)
        synchronize(device)
        times.append(1000 * (time.perf_counter() - start))
    return times


def timed_hf(model, prompt: torch.Tensor, max_new_tokens: int,
             attention=decoding_attention) -> tuple[list[int], float]:
    """HF ``generate``'s greedy new tokens and its seconds (after a short warm-up), its
    attention chosen by ``attention(device)`` (by default as ours: not cuDNN's)."""
    prompt = prompt.to(model.device)
    with attention(model.device):
        model.generate(prompt, max_new_tokens=4, do_sample=False)
        synchronize(model.device)
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
        synchronize(model.device)
    return out[0, prompt.shape[1]:].tolist(), time.perf_counter() - start


def hf_rows(model, prompt: torch.Tensor, max_new_tokens: int) -> tuple[list[int], list[dict]]:
    """HF greedy with our attention kernels (the reference text), then with torch's default
    choice (cuDNN's among them on a GPU)."""
    rows, texts = [], []
    for name, attention in (("hf generate", decoding_attention),
                            ("hf generate, torch's default attention", default_attention)):
        text, seconds = timed_hf(model, prompt, max_new_tokens, attention)
        texts.append(text)
        rows.append(dict(method=name, steps=len(text), seconds=seconds, new_tokens=len(text),
                         mean_forward_tokens=1.0, identical=text == texts[0],
                         step_ms=[1000 * seconds / len(text)]))
    return texts[0], rows


def default_attention(device: torch.device) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def decode_runs(model, draft, prompt: torch.Tensor, shapes, max_new_tokens: int,
                passes: int) -> list[dict]:
    """HF greedy, then each of ours (``runs``) ``passes`` times in turn on ``prompt`` [1, L]:
    a later pass meets no shape a GPU has not seen. Each row: its steps' times and whether
    its text is HF's."""
    reference, rows = hf_rows(model, prompt, max_new_tokens)
    for number in range(1, passes + 1):
        for name, method, options in runs(shapes, draft):
            new, stats, step_ms = timed_stream(model, prompt, max_new_tokens, method, options)
            rows.append(dict(method=name, run=number, steps=stats.steps, seconds=stats.seconds,
                             new_tokens=stats.new_tokens,
                             mean_forward_tokens=stats.mean_forward_tokens,
                             identical=new == reference, step_ms=step_ms))
            print(f"{name} (run {number}): {stats.steps} steps, median "
                  f"{statistics.median(step_ms):.1f} ms/step, mean {statistics.mean(step_ms):.1f}",
                  flush=True)
            if new != reference:
                rows[-1]["divergence"] = divergence(model, prompt, reference, new)
                print(f"  differs from HF: {rows[-1]['divergence']}", flush=True)
    return rows


@torch.inference_mode()
def divergence(model, prompt: torch.Tensor, reference: list[int], new: list[int]) -> dict:
    """Where ``new`` first leaves HF's ``reference``, and by how much the two tokens' logits
    differ there (one full forward over the text up to that point). A gap within a pass's
    rounding (bfloat16: ~0.1 on logits of a few units) is a near-tie that two kernels broke
    differently, not a wrong token."""
    at = next(i for i, (a, b) in enumerate(zip(reference, new)) if a != b)
    ids = torch.cat([prompt[0], torch.tensor(reference[:at], dtype=torch.long)]).to(model.device)
    logits = model(input_ids=ids.unsqueeze(0), logits_to_keep=1).logits[0, -1].float()
    top = logits.topk(2).values
    return dict(at=at, hf_token=reference[at], our_token=new[at],
                logit_gap=float(logits[reference[at]] - logits[new[at]]),
                top2_margin=float(top[0] - top[1]), top_logit=float(top[0]))


def timed_stream(model, prompt: torch.Tensor, max_new_tokens: int, method: str,
                 options: dict) -> tuple[list[int], lookahead.GenerationStats, list[float]]:
    """Decode with ``lookahead.stream``: the new tokens, the stats and each step's ms (the
    prefill left out; a step ends when its tokens reach the CPU)."""
    stream = lookahead.stream(model, prompt, max_new_tokens, method=method, **options)
    marks = [time.perf_counter() for _ in stream]
    new = stream.sequences[0, prompt.shape[1]:].tolist()
    return new, stream.stats, [1000 * (b - a) for a, b in zip(marks, marks[1:])]


def runs(shapes, draft) -> list[tuple[str, str, dict]]:
    """(name, method, options): autoregressive, lookahead per shape with the window at every
    step (``token_cost=0``), prompt lookup, and the draft method with the random draft model."""
    return (
        [("autoregressive", "autoregressive", {})]
        + [(f"lookahead W{w} N{n} G{g}", "lookahead", dict(window=w, ngram=n, guess=g,
                                                           token_cost=0.0))
           for w, n, g in shapes]
        + [("prompt lookup", "prompt_lookup", {}),
           ("draft (K=4)", "draft", dict(draft_model=draft, num_draft_tokens=4))]
    )


def add_overhead(rows: list[dict], curve: dict) -> None:
    """Each row's median and 90th-percentile ms per step, and the median less one forward of
    its mean step size on ``curve``: our per-step work, and whatever the GPU waits for."""
    for row in rows:
        row["ms_per_step"] = statistics.median(row["step_ms"])
        row["p90_ms"] = statistics.quantiles(row["step_ms"], n=10)[-1] if len(
            row["step_ms"]) > 1 else row["ms_per_step"]
        row["forward_ms"] = 1000 * cost_at(curve, row["mean_forward_tokens"])
        row["overhead_ms"] = row["ms_per_step"] - row["forward_ms"]


def markdown(setting: str, curves: dict[int, dict], rows: list[dict]) -> str:
    """The curves (ms and cost relative to k = 1) and the decoding rows as Markdown."""
    lengths = list(curves)
    tokens = curves[lengths[0]]["tokens"]
    lines = [setting, "", "| k | " + " | ".join(
        f"ms at {n} cached | x one token at {n}" for n in lengths) + " |",
        "|--:|" + "--:|--:|" * len(lengths)]
    for i, k in enumerate(tokens):
        cells = [f"{1000 * curves[n]['seconds'][i]:.2f} | "
                 f"{curves[n]['seconds'][i] / curves[n]['seconds'][0]:.2f}" for n in lengths]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += ["", "HF's ms/step is its mean; ours are medians (p90 beside them).", "",
              "| run | steps | tokens/step | fed tokens/step | ms/step | p90 ms | forward ms at "
              "that size | step less forward ms | tok/s | identical to HF |",
              "|---|--:|--:|--:|--:|--:|--:|--:|--:|:-:|"]
    for r in rows:
        name = r["method"] + (f" (run {r['run']})" if "run" in r else "")
        lines.append(
            f"| {name} | {r['steps']} | {r['new_tokens'] / r['steps']:.2f} | "
            f"{r['mean_forward_tokens']:.1f} | {r['ms_per_step']:.2f} | {r['p90_ms']:.2f} | "
            f"{r['forward_ms']:.2f} | "
            f"{r['overhead_ms']:.2f} | {r['new_tokens'] / r['seconds']:.1f} | "
            f"{'yes' if r['identical'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def plot(curves: dict[int, dict], rows: list[dict], title: str, path: Path) -> None:
    """ms against k, one line per cached length, and the median step of each run of the last
    pass (whose shapes the GPU has met before)."""
    last = max((row.get("run", 0) for row in rows), default=0)
    shown = [row for row in rows if row.get("run", last) == last]
    figure = Figure(figsize=(6.4, 4.4), dpi=120)
    axes = figure.add_subplot()
    for length, curve in curves.items():
        axes.plot(curve["tokens"], [1000 * s for s in curve["seconds"]], "o-",
                  label=f"one forward, {length} cached tokens")
    axes.plot([r["mean_forward_tokens"] for r in shown], [r["ms_per_step"] for r in shown], "k^",
              label="a whole decoding step (median; HF generate's mean)")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("new tokens k in one forward pass")
    axes.set_ylabel("latency (ms)")
    axes.set_ylim(bottom=0)
    axes.set_title(textwrap.fill(title, 90), fontsize=7)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)


def describe(device: torch.device, preset: str, dtype: torch.dtype) -> str:
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else platform.processor() or platform.machine())
    return (f"random-weight {preset} ({PRESETS[preset]['num_hidden_layers']} layers, hidden "
            f"{PRESETS[preset]['hidden_size']}), {str(dtype).removeprefix('torch.')}, {name}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_results:
        saved = json.loads(args.from_results.read_text())
        curves = {int(n): curve for n, curve in saved["curves"].items()}
        print(save(args.out or args.from_results.parent, saved["setting"], curves, saved["runs"]))
        return 0
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    contexts, tokens = list(args.contexts), list(args.tokens)
    generator = torch.Generator().manual_seed(args.seed)
    model = build_model(args.preset, dtype, device, args.seed)
    setting = describe(device, args.preset, dtype)
    print(setting, flush=True)
    warm_up(model, args.warm_up)
    curves = measure_curves(model, contexts, tokens, args.repeats, generator)
    prompt = torch.randint(model.config.vocab_size, (1, contexts[0]), generator=generator)
    save(args.out, setting, curves, [])  # the curve survives a failure in the decoding
    for name, attention in (("our", decoding_attention), ("torch's default", default_attention)):
        for k in (1, 16):
            fresh = torch.randint(model.config.vocab_size, prompt.shape, generator=generator)
            with attention(device):
                times = growing_cache_ms(model, fresh, k, 64)
            print(f"{k} tokens on a growing cache, {name} attention: median "
                  f"{statistics.median(times):.2f} ms, first {times[0]:.2f}, max {max(times):.2f}",
                  flush=True)
    draft = build_model("draft", dtype, device, args.seed, model.config.vocab_size)
    rows = decode_runs(model, draft, prompt, args.shapes, args.max_new_tokens, args.passes)
    add_overhead(rows, curves[contexts[0]])
    print(save(args.out, setting, curves, rows))
    return 0 if all(r["identical"] for r in rows) else 1


def save(out: Path | None, setting: str, curves: dict[int, dict], rows: list[dict]) -> str:
    """Write results.json, curve.md and curve.png into ``out`` (if given); return the report."""
    report = markdown(setting, curves, rows)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "curve.md").write_text(report)
        (out / "results.json").write_text(json.dumps(
            dict(setting=setting, curves=curves, runs=rows), indent=1))
        plot(curves, rows, setting, out / "curve.png")
    return report


if __name__ == "__main__":
    sys.exit(main())
