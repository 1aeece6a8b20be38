"""Several option sets of our methods in one process, alternating prompt by prompt.

``lookahead bench`` runs each method once with one set of options; this runs variants of the
same method (or others) side by side, each prompt through every variant in turn, so that a
slow minute of a shared machine hits them all alike. Greedy; every variant's text must equal
the first's (it prints DIFFER otherwise). A variant ``{"share": true}`` keeps one
``SuccessorTable`` across its prompts, as a server does::

    python benchmarks/ab_options.py --model smollm2-135m \
        --dataset benchmarks/task-groups-12.jsonl --limit 12 --max-new-tokens 128 --variants \
        '{"ar": {"method": "autoregressive"}, "off": {}, "own": {"recycle": 8}, "shared": {"share": true, "recycle": 8}}'

A variant ``{"proposer_at": "REV"}`` runs the lookahead proposer as it was at git revision
REV (``src/lookahead/proposers/lookahead.py`` then, on the library as it is now), so that a
change to the proposer is measured against what it replaces in one process::

    python benchmarks/ab_options.py --variants \
        '{"before": {"proposer_at": "55db356"}, "after": {}}'

A variant ``{"nontemporal": false}`` (or true) runs with the quantized kernel asking for the
weights a step reads once as non-temporal or not (``QuantLinear``'s ``nontemporal``; the
default follows the CPU), the same weights in one process; the step costs lookahead prices
its candidates on are measured once, with the first variant's::

    python benchmarks/ab_options.py --model qwen2.5-coder-1.5b \
        --dataset benchmarks/chat-mix-11.jsonl --limit 11 --max-new-tokens 256 --variants \
        '{"usual": {"method": "autoregressive", "nontemporal": false}, "nta": {"method": "autoregressive", "nontemporal": true}}'

A variant ``{"ahead": 2048}`` runs with the kernel asking for the weights that many bytes
ahead of its reads (``QuantLinear.ahead``; by default what ``lookahead.kernels.prefetch``
measured for this model and CPU at load); with ``"near": 512`` too, it asks for them to L2
that far ahead and to L1 512 bytes ahead (``QuantLinear.near``)::

    python benchmarks/ab_options.py --model qwen2.5-coder-1.5b --dataset mtbench --limit 4 \
        --max-new-tokens 128 --variants '{"ar2k": {"method": "autoregressive", "ahead": 2048}, "ar4k": {"method": "autoregressive", "ahead": 4096}}'

A variant ``{"explore": 32}`` prices steps with ``StepClock(explore=32)``: that many sizes
past the largest a request has measured at the measured sizes' mean step (by default 2,
then the tuned curve's ratios)::

    python benchmarks/ab_options.py --model qwen2.5-coder-1.5b \
        --dataset benchmarks/chat-mix-11.jsonl --limit 11 --max-new-tokens 256 --variants \
        '{"ar": {"method": "autoregressive"}, "slope": {"share": true, "explore": 32}, "now": {"share": true}}'

Prints a line per prompt and variant, then per variant the decode-only tok/s (new tokens
after the first over the seconds after the first token: the prompt's prefill is the same
for all), tokens per step and tokens fed per step, and per prompt group (the JSONL
``category``) the end-to-end tok/s of each variant against the first's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

import torch

import lookahead.proposers.gauges as gauges
import lookahead.proposers.lookahead as lookahead_proposer
from lookahead import SuccessorTable, generate
from lookahead.bench.datasets import encode_prompt, load_prompts
from lookahead.kernels.quant_linear import QuantLinear
from lookahead.models.load import load_model
from lookahead.proposers.step_clock import StepClock


def proposer_at(revision: str) -> type:
    """``LookaheadProposer`` as git revision ``revision`` had it."""
    root = Path(__file__).resolve().parent.parent
    shown = subprocess.run(
        ["git", "show", f"{revision}:src/lookahead/proposers/lookahead.py"], cwd=root,
        capture_output=True, text=True)
    if shown.returncode != 0:
        raise SystemExit(f"--variants: proposer_at {revision!r}: expected a git revision of "
                         f"this repository with src/lookahead/proposers/lookahead.py "
                         f"({shown.stderr.strip()})")
    source = shown.stdout
    path = Path(tempfile.mkdtemp()) / f"lookahead_at_{revision}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module.LookaheadProposer


@contextmanager
def swapped(module, name: str, value):
    """Inside, ``module.name`` is ``value``; it is what it was again on the way out."""
    current = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, current)


def proposer(cls: type | None):
    """``method="lookahead"`` builds ``cls``'s proposers inside (the current one if None)."""
    return swapped(lookahead_proposer, "LookaheadProposer",
                   cls or lookahead_proposer.LookaheadProposer)


def exploring(sizes: int | None):
    """Inside, requests price their steps with ``StepClock(explore=sizes)`` (as they do if
    None)."""
    if sizes is None:
        return nullcontext()
    if isinstance(sizes, bool) or not isinstance(sizes, int) or sizes < 0:
        raise SystemExit(f"--variants: explore: expected sizes >= 0, got {sizes!r}")
    return swapped(gauges, "StepClock", partial(StepClock, explore=sizes))


@contextmanager
def prefetch_hint(model, nontemporal: bool | None, ahead: int | None = None,
                  near: int | None = None):
    """Inside, every ``QuantLinear`` of ``model`` asks for the weights it reads once as
    non-temporal or not, ``ahead`` bytes ahead of its reads, and where ``near`` is not 0,
    those to L2 and to L1 ``near`` bytes ahead (each as it was if None)."""
    if nontemporal is None and ahead is None and near is None:
        yield
        return
    if near is not None and (not isinstance(near, int) or isinstance(near, bool)
                             or near < 0):
        raise SystemExit(f"--variants: near: expected bytes >= 0, got {near!r}")
    if nontemporal is not None and not isinstance(nontemporal, bool):
        raise SystemExit(f"--variants: nontemporal: expected true or false, got {nontemporal!r}")
    if ahead is not None and (not isinstance(ahead, int) or isinstance(ahead, bool)
                              or ahead < 0):
        raise SystemExit(f"--variants: ahead: expected bytes >= 0, got {ahead!r}")
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    if not layers:
        raise SystemExit("--variants: nontemporal: expected a model on the quantized kernel "
                         "(a GGUF model on the CPU); this one has no QuantLinear layers")
    before = [(layer.nontemporal, layer.ahead, layer.near) for layer in layers]
    try:
        for layer in layers:
            layer.nontemporal = layer.nontemporal if nontemporal is None else nontemporal
            layer.ahead = layer.ahead if ahead is None else ahead
            layer.near = layer.near if near is None else near
        model.to(model.device)  # the fused layers take their kernel calls again
        yield
    finally:
        for layer, (hint, distance, l1) in zip(layers, before):
            layer.nontemporal, layer.ahead, layer.near = hint, distance, l1
        model.to(model.device)


def run(model, tokenizer, prompts, variants: dict, max_new_tokens: int) -> dict:
    """{variant: [decode tokens, decode seconds, steps, fed tokens]} over ``prompts``, and
    {(group, variant): [tokens, seconds]}."""
    tables = {name: SuccessorTable() for name, opts in variants.items() if opts.get("share")}
    classes = {name: proposer_at(opts["proposer_at"]) for name, opts in variants.items()
               if "proposer_at" in opts}
    totals = {name: [0, 0.0, 0, 0] for name in variants}
    groups: dict[tuple[str, str], list] = {}
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt)
        texts = {}
        for name, opts in variants.items():
            opts = dict(opts)
            method = opts.pop("method", "lookahead")
            opts.pop("proposer_at", None)
            hint = opts.pop("nontemporal", None)
            ahead, near = opts.pop("ahead", None), opts.pop("near", None)
            explore = opts.pop("explore", None)
            if opts.pop("share", False):
                opts["successors"] = tables[name]
            with proposer(classes.get(name)), prefetch_hint(model, hint, ahead, near), \
                    exploring(explore):
                stats = (result := generate(model, ids, max_new_tokens=max_new_tokens,
                                            method=method, do_sample=False, **opts)).stats
            group = groups.setdefault((prompt.category or prompt.id, name), [0, 0.0])
            group[0] += stats.new_tokens
            group[1] += stats.seconds
            texts[name] = result.new_tokens[0].tolist()
            row = totals[name]
            row[0] += stats.new_tokens - 1
            row[1] += stats.seconds - stats.time_to_first_token
            row[2] += stats.steps - 1
            row[3] += sum(stats.forward_tokens_per_step[1:])
            print(f"{prompt.id[:24]:24s} {name:8s} {stats.new_tokens / stats.seconds:7.1f} "
                  f"tok/s  {stats.tokens_per_step:.2f} tokens/step", flush=True)
        first = next(iter(texts.values()))
        print("  identical" if all(t == first for t in texts.values()) else "  DIFFER")
    return totals, groups


def decoding_arguments(description: str) -> argparse.ArgumentParser:
    """A parser with the options of a decoding run over a data set: --model, --dataset,
    --limit, --max-new-tokens, --threads (this script's and the scripts beside it)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", default="benchmarks/task-groups-12.jsonl")
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def decoding_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """``(model, tokenizer, prompts)`` of ``decoding_arguments``' options, torch set to their
    ``--threads``; a data set, limit or model the library refuses ends the script with the
    parser's error, not a traceback."""
    torch.set_num_threads(args.threads)
    try:
        prompts = load_prompts(args.dataset, limit=args.limit)
        model, tokenizer = load_model(args.model)[:2]
    except ValueError as error:
        parser.error(str(error))
    return model, tokenizer, prompts


def main(argv: list[str] | None = None) -> int:
    parser = decoding_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--variants", required=True,
                        help='JSON: {"name": {generate keywords, "method": ..., "share": bool, '
                             '"proposer_at": REV, "nontemporal": bool, "ahead": bytes, '
                             '"near": bytes, "explore": sizes}}')
    args = parser.parse_args(argv)
    variants = json.loads(args.variants)
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        parser.error('--variants must be a JSON object of objects, e.g. {"off": {"recycle": 0}}')
    model, tokenizer, prompts = decoding_inputs(parser, args)
    totals, groups = run(model, tokenizer, prompts, variants, args.max_new_tokens)
    for name, (tokens, seconds, steps, fed) in totals.items():
        print(f"{name:8s} decode {tokens / seconds:6.1f} tok/s  {tokens / max(steps, 1):.2f} "
              f"tokens/step  {fed / max(steps, 1):.2f} fed/step")
    first = next(iter(variants))
    for group in sorted({group for group, _ in groups}):
        base = groups[(group, first)][0] / groups[(group, first)][1]
        cells = [f"{name} {tokens / seconds:6.1f} ({tokens / seconds / base:.2f}x)"
                 for name in variants for tokens, seconds in [groups[(group, name)]]]
        print(f"{group[:16]:16s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
