"""Choose the lookahead shape (window, ngram, guess) that is fastest on this machine.

Lookahead decoding trades spare compute for fewer steps: a step with more tokens costs a little
more and accepts more. Which trade wins depends on the machine. The tuner:

1. measures the *forward-cost curve*: the median latency of one forward pass with k new tokens
   on top of a cached prompt, for k in ``tokens`` (1, 2, 4, ..., 96), made non-decreasing in k
   (``monotone``: more tokens never cost less; a dip is a timing's noise), once before the
   shapes run and once after, keeping each size's faster timing (``fastest_curve``: another
   job only adds time);
2. runs a few lookahead shapes on a few sample prompts of each data set (code, chat and maths
   by default, so that the choice is not one kind of text's; spread across each set, so that it
   is not one corner's) and records their tokens per step and the tokens each step fed to the
   model;
3. predicts each shape's decoding speed on each prompt, ``tokens / sum(cost(forward tokens of
   each step) + step overhead)``, from the curve (robust against a noisy machine: the
   acceptance, not the timing, comes from the short sample runs; the overhead, what a step
   costs beside its forward pass, is the shapes' median gap between measured and predicted
   step time), and ranks the shapes by their speed relative to
   the default's, prompt by prompt -- but keeps the default shape unless another is predicted
   faster by more than ``margin`` (a smaller lead is within the noise), no slower on any one
   data set, and faster on most sample prompts (see ``choose_shape``);
4. saves a profile ``<cache>/profiles/<model>-<dtype>[-packed]-<device>.json`` and a PNG of the
   curve. Packed and plain weights keep a profile each: packing changes the curve, and so the
   best shape.

``resolve_shape(model, dtype, packed=...)`` then gives the saved best shape (or ``DEFAULT_SHAPE``);
``lookahead.generate(..., window="auto")`` and the commands, when no window is given, use it.

A *workload* profile (``TuneConfig(workload="code", dataset="humaneval")``, saved as
``<model>-<dtype>-<device>-code.json``) is tuned on one kind of text only: the best shape for
code need not be the best for chat. ``resolve_shape(..., workload="code")`` reads it, and falls
back to the general profile where there is none.

Example::

    profile = tune(TuneConfig(model="smollm2-135m", dtype="bfloat16"))
    shape = resolve_shape("smollm2-135m", "bfloat16")   # {"window": 7, "ngram": 5, "guess": 7}
    lookahead.generate(model, input_ids, method="lookahead", **shape)
"""

from __future__ import annotations

import bisect
import json
import logging
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType

import numpy as np
import torch
import transformers

import lookahead
from lookahead.attention import attention_mask, decoding_attention, mask_to
from lookahead.cache import cache_keyword, new_cache
from lookahead.config import LookaheadConfig, check_int, check_step_tokens, check_workload
from lookahead.datasets import Prompt, encode_prompt, load_prompts, spread
from lookahead.datastore import Datastore, check_spec, load_datastore
from lookahead.models import (
    AUTO_DTYPE,
    DEFAULT_MODEL,
    default_cache_dir,
    dtype_name,
    load_model,
    resolve_dtype,
)
from lookahead.packing import apply_packing, check_packable_dtype

logger = logging.getLogger(__name__)

_DEFAULTS = LookaheadConfig()
DEFAULT_SHAPE: Mapping[str, int] = MappingProxyType(
    dict(window=_DEFAULTS.window, ngram=_DEFAULTS.ngram, guess=_DEFAULTS.guess)
)
# On a GPU the tokens of a step come nearly free: on an H200, with a 7B Llama in bf16, a pass
# of 256 new tokens cost at most 1.06x a pass of one, and a whole W15 N5 G15 step 1.07x a
# plain step (docs/results/gpu-h200-s33). Untuned, a CUDA model gets the paper's shape for 7B
# models on an A100, its window at every step (token_cost 0), as the paper runs it.
GPU_DEFAULT_SHAPE: Mapping[str, float] = MappingProxyType(
    dict(window=15, ngram=5, guess=15, token_cost=0.0)
)
DEFAULT_LOOKUP_TOKENS = _DEFAULTS.lookup_tokens
DEFAULT_TOKEN_COST = _DEFAULTS.token_cost  # the shipped price: what an untuned run cuts at
# What a profile's best shape holds: (W, N, G), and the length of the copied continuation
# that lookahead verifies beside its pool's n-grams (a 4th number in a shape tuple).
SHAPE_KEYS = ("window", "ngram", "guess", "lookup_tokens")
# A profile's best may also cap the tokens a step feeds (``lookahead.generate``'s
# ``max_step_tokens``): a decoding option, not a ``LookaheadConfig`` field.
STEP_KEY = "max_step_tokens"
DEFAULT_TOKENS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96)
# On a CPU a forward of 8-16 tokens costs little more than one, while 64 costs two to three
# times as much (without AMX the curve is steeper still): the set is dense in small windows
# around the default, and keeps the paper's wider shapes for machines where they pay. A
# longer copied continuation (the 4th number, lookup_tokens; 8 when left out) costs forward
# tokens only when the text repeats itself, and then often pays: SmolLM2 on HumanEval went
# from 3.13 to 3.42 tokens/step with 24 in place of 8. Where a pass of 8 tokens costs clearly
# more than one of 4 (float32 taken weight first on an AVX2 CPU), a shorter one pays instead:
# 1x4x2x4 won GSM8K there in session 27; once one-token passes got cheaper too (session 28),
# 1x3x2x4 won HumanEval and GSM8K, and 1x4x3 MT-Bench.
DEFAULT_SHAPES = (
    (1, 5, 3), (1, 4, 6), (1, 4, 3), (2, 4, 4), (2, 5, 4), (2, 5, 6), (2, 6, 6), (3, 5, 5),
    (4, 5, 4), (7, 5, 7), (15, 5, 15), (2, 5, 4, 16), (2, 5, 4, 24), (2, 4, 4, 16),
    (1, 5, 3, 16), (1, 4, 2, 4), (1, 3, 2, 4),
)
SELECT = ("predicted", "measured")
SAMPLES = ("spread", "first")
DEFAULT_DATASETS = "humaneval,mtbench,gsm8k"
PROFILE_VERSION = 1

# Called with (done, total, description) as the tuner goes.
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class TuneConfig:
    """What to tune. ``shapes`` are (window, ngram, guess) triples; ``select`` picks the best
    by the curve's prediction ("predicted") or by the sample runs' own timing ("measured").
    ``dataset`` is one data set or several, comma-separated: ``limit`` prompts of each are
    sampled, spread evenly across it (``sample="spread"``, see ``datasets.spread``) or the
    first ones (``"first"``). ``margin``: another shape replaces the default only if it is
    predicted faster by more than this fraction (and no slower on any data set, and faster on
    most prompts; see ``choose_shape``). ``workload``: save the
    profile under this name (one kind of text, e.g. "code"), not as the model's general one.
    ``packed_weights``: tune on packed weights (``lookahead.packing``) as the commands run
    them: True, False, or None where the model allows it. ``datastore``: the shapes also copy
    from this corpus ("stdlib", "python" or a file or folder of text, see ``load_datastore``),
    as the commands run with ``--datastore``: the copies it adds are forward tokens too, and can
    move the best shape. ``cost_scales``: each shape runs at the curve's token cost times
    each of these, so that the token cost is chosen with the shape (the curve's one slope can
    under- or overstate what the tokens a step feeds cost; see ``_runs``). ``step_caps``:
    each shape also runs with each of these caps on the tokens a step feeds
    (``max_step_tokens``; None: no cap), so that the cap is chosen with the shape: the curve
    bends, and where 8 tokens cost far more than 6 a capped step can be the faster one."""

    model: str = DEFAULT_MODEL
    dtype: str = AUTO_DTYPE
    tokens: tuple[int, ...] = DEFAULT_TOKENS
    repeats: int = 5
    shapes: tuple[tuple[int, ...], ...] = DEFAULT_SHAPES
    dataset: str = DEFAULT_DATASETS
    limit: int = 2
    max_new_tokens: int = 128
    select: str = "predicted"
    sample: str = "spread"
    margin: float = 0.03
    cache_dir: str | None = None
    workload: str | None = None
    packed_weights: bool | str | None = None
    datastore: str | None = None
    cost_scales: tuple[float, ...] = (1.0,)
    step_caps: tuple[int | None, ...] = (None,)
    device: str | None = None  # where the model runs (None: the CPU)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if not self.cost_scales or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= x <= 10.0
            for x in self.cost_scales
        ):
            raise ValueError(f"cost_scales must list numbers in [0, 10], got {self.cost_scales!r}")
        if not self.step_caps:
            raise ValueError("step_caps must list at least one cap (None: no cap)")
        for cap in self.step_caps:
            if cap is not None:
                check_int("step_caps", cap, 1, 1 << 16)
        caps = sorted(set(self.step_caps), key=lambda cap: (cap is not None, cap or 0))
        object.__setattr__(self, "step_caps", tuple(caps))  # None (no cap) first
        if self.datastore is not None:
            check_spec(self.datastore)  # before the model loads
        if self.workload is not None:
            check_workload(self.workload)
        check_packable_dtype(self.packed_weights, resolve_dtype(self.dtype))
        if not self.tokens:
            raise ValueError("tokens must list at least one forward size")
        for k in self.tokens:
            check_int("tokens", k, 1, 4096)
        # A capped step feeds up to its cap: the curve is measured there, not interpolated.
        capped = {cap for cap in self.step_caps if cap is not None and cap <= 4096}
        object.__setattr__(self, "tokens", tuple(sorted(set(self.tokens) | capped)))
        check_int("repeats", self.repeats, 1, 1000)
        check_int("limit", self.limit, 1, 1 << 20)
        check_int("max_new_tokens", self.max_new_tokens, 2, 1 << 20)
        if not self.shapes:
            raise ValueError("shapes must list at least one (window, ngram, guess)")
        for shape in self.shapes:
            if len(shape) not in (3, 4):
                raise ValueError(
                    f"a shape is (window, ngram, guess[, lookup_tokens]), got {shape!r}"
                )
            LookaheadConfig(**shape_dict(shape))
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {self.margin!r}")
        if not self.datasets:
            raise ValueError(f"dataset must name at least one data set, got {self.dataset!r}")
        if self.select not in SELECT:
            raise ValueError(f"select must be one of {', '.join(SELECT)}, got {self.select!r}")
        if self.sample not in SAMPLES:
            raise ValueError(f"sample must be one of {', '.join(SAMPLES)}, got {self.sample!r}")

    @property
    def datasets(self) -> list[str]:
        """The data sets named in ``dataset``."""
        return [name.strip() for name in self.dataset.split(",") if name.strip()]


# ----------------------------------------------------------------------------- measuring


@torch.inference_mode()
def forward_cost_curve(model, input_ids: torch.Tensor, tokens, repeats: int = 5) -> dict:
    """Median seconds of one forward pass with k new tokens after the cached ``input_ids``.

    The k tokens attend causally through an explicit 4D mask, as a lookahead step's do (k = 1
    goes without a mask, as a plain decoding step does); every row's logits are computed. The
    sizes are interleaved within each repeat so that a slow spell hits all of them alike.

    Returns ``dict(tokens=[k...], seconds=[median...], prompt_tokens=L)``.
    """
    device = model.device
    with decoding_attention(device):  # as our decoding has it, and its cache
        return _cost_curve(model, input_ids.to(device), tokens, repeats, new_cache())


def _cost_curve(model, input_ids: torch.Tensor, tokens, repeats: int, cache) -> dict:
    """``forward_cost_curve`` with ``input_ids`` [1, L] on the model's device, into ``cache``."""
    keyword, device = cache_keyword(model), model.device
    model(input_ids=input_ids, **{keyword: cache}, use_cache=True, logits_to_keep=1)
    past = cache.get_seq_length()
    prompt = input_ids[0]
    timings: dict[int, list[float]] = {k: [] for k in tokens}
    for repeat in range(repeats + 1):  # the first round warms up
        for k in tokens:
            ids = prompt[torch.arange(k, device=device) % len(prompt)].unsqueeze(0)
            positions, mask = causal_step(model, past, k)
            synchronize(device)
            start = time.perf_counter()
            model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                **{keyword: cache},
                use_cache=True,
            )
            synchronize(device)  # a GPU returns before it has run the pass
            elapsed = time.perf_counter() - start
            cache.crop(-k)  # transformers 5 crops by a negative count only
            if repeat:
                timings[k].append(elapsed)
    return dict(
        tokens=list(tokens),
        seconds=monotone([statistics.median(timings[k]) for k in tokens]),
        prompt_tokens=past,
    )


def causal_step(model, past: int, k: int) -> tuple[torch.Tensor, torch.Tensor | dict | None]:
    """Position ids [1, k] and the 4D mask of ``k`` new tokens that attend causally after
    ``past`` cached ones, on the model's device (no mask for k = 1, as a plain step has)."""
    positions = torch.arange(past, past + k).unsqueeze(0)
    mask = None
    if k > 1:
        visible = torch.tril(torch.ones(k, k, dtype=torch.bool))
        mask = attention_mask(model.config, visible, past, positions, model.dtype)
        mask = mask_to(mask, model.device)
    return positions.to(model.device), mask


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op on the CPU, which runs it in the call)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fastest_curve(curves: list[dict]) -> dict:
    """Curves measured at different times, as one: each size's fastest median, made
    non-decreasing. Another job only ever adds time, so the fastest timing is the closest to
    the machine's own."""
    seconds = [min(values) for values in zip(*(curve["seconds"] for curve in curves))]
    return curves[0] | dict(seconds=monotone(seconds))


def monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (isotonic regression, by pooling
    adjacent violators): a forward pass of more tokens never costs less, so where a median dips
    below a smaller size's, both are noise around their common mean."""
    blocks: list[list[float]] = []  # [mean, count] of pooled runs
    for value in values:
        blocks.append([value, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (mean_b, count_b), (mean_a, count_a) = blocks.pop(), blocks.pop()
            count = count_a + count_b
            blocks.append([(mean_a * count_a + mean_b * count_b) / count, count])
    return [mean for mean, count in blocks for _ in range(count)]


def cost_at(curve: Mapping, k: float) -> float:
    """Seconds of a forward with ``k`` new tokens: linear between measured sizes, extended
    along the first or last segment outside them."""
    ks, seconds = curve["tokens"], curve["seconds"]
    if len(ks) == 1:
        return seconds[0] * max(k, 1) / ks[0] if k > ks[0] else seconds[0]
    i = min(max(bisect.bisect_left(ks, k), 1), len(ks) - 1)
    k0, k1, s0, s1 = ks[i - 1], ks[i], seconds[i - 1], seconds[i]
    return max(s0 + (s1 - s0) * (k - k0) / (k1 - k0), 0.0)


def token_cost_of(curve: Mapping, up_to: int = 32) -> float:
    """What one more token costs as a fraction of a one-token pass (``LookaheadConfig.
    token_cost``): the least-squares slope of the curve over sizes up to ``up_to`` (where a
    lookahead step's live), over the cost of one token; in [0, 1]."""
    points = [(k, s) for k, s in zip(curve["tokens"], curve["seconds"]) if k <= up_to]
    if len(points) < 2:
        return DEFAULT_TOKEN_COST
    slope = float(np.polyfit(*zip(*points), deg=1)[0])
    return min(max(slope / cost_at(curve, 1), 0.0), 1.0)


def measure_shape(model, prompts: Mapping[str, list[torch.Tensor]], shape, max_new_tokens: int,
                  curve, token_cost: float | None = None, step_overhead: float = 0.0,
                  datastore: Datastore | None = None, step_cap: int | None = None) -> dict:
    """Run lookahead with ``shape`` on ``prompts`` (data set -> prompts); its acceptance,
    timing and predicted speed (``predict``). ``token_cost``: the price at which the window
    must pay (the default's when None). ``datastore``: a corpus the shape also copies from.
    ``step_cap``: the most tokens a step feeds (``max_step_tokens``; None: no cap).

    Decoding figures leave the prefill out: ``tokens_per_step`` is tokens after the first per
    decoding step. ``prompt_runs`` keeps, per data set and prompt, [tokens after the first,
    decoding steps, the curve's seconds for those steps' forward passes, [[k, steps that fed
    k tokens], ...]] (the last, so that ``reprice`` can price the run on another curve).
    """
    options = shape_dict(shape)
    if token_cost is not None:
        options["token_cost"] = token_cost
    if step_cap is not None:
        options[STEP_KEY] = step_cap
    decode_seconds = 0.0
    forward: list[int] = []
    runs: dict[str, list[list[float]]] = {}
    for name, inputs in prompts.items():
        runs[name] = []
        for input_ids in inputs:
            stats = lookahead.generate(model, input_ids, max_new_tokens, "lookahead",
                                       do_sample=False, datastore=datastore, **options).stats
            decode_seconds += stats.seconds - stats.time_to_first_token
            step_tokens = stats.forward_tokens_per_step[1:]
            forward += step_tokens
            sizes = sorted(Counter(step_tokens).items())
            runs[name].append([stats.new_tokens - 1, stats.steps - 1,
                               _forward_seconds(curve, sizes), [list(n) for n in sizes]])
    every = [run for set_runs in runs.values() for run in set_runs]
    new, steps = sum(run[0] for run in every), sum(run[1] for run in every)
    row = dict(
        **options,
        tokens_per_step=new / steps if steps else 1.0,
        mean_forward_tokens=sum(forward) / len(forward) if forward else 1.0,
        measured_tokens_per_second=_rate(new, decode_seconds),
        measured_step_ms=1000 * decode_seconds / steps if steps else 0.0,
        prompt_runs=runs,
    )
    return predict(row, step_overhead)


def _forward_seconds(curve: Mapping, sizes) -> float:
    """The curve's seconds for the forward passes of ``sizes``, [(k, passes of k tokens)]."""
    return sum(cost_at(curve, k) * count for k, count in sizes)


def reprice(row: dict, curve: Mapping) -> dict:
    """``row`` with each prompt run's forward seconds read off ``curve`` instead (not yet
    ``predict``-ed again)."""
    runs = {name: [[*run[:2], _forward_seconds(curve, run[3]), run[3]] for run in set_runs]
            for name, set_runs in row["prompt_runs"].items()}
    return row | dict(prompt_runs=runs)


def predict(row: dict, step_overhead: float = 0.0) -> dict:
    """``row`` with its predicted decoding speed: each prompt's tokens over the curve's cost
    of its steps' forward passes plus ``step_overhead`` seconds per step -- overall
    (``predicted_tokens_per_second``), per data set (``predicted_per_dataset``) and per prompt
    (``predicted_per_prompt``: data set -> the rate of each of its prompts)."""
    runs = row["prompt_runs"]

    def seconds(run: list[float]) -> float:
        return run[2] + run[1] * step_overhead

    every = [run for set_runs in runs.values() for run in set_runs]
    steps, total = sum(run[1] for run in every), sum(map(seconds, every))
    return row | dict(
        predicted_tokens_per_second=_rate(sum(run[0] for run in every), total),
        predicted_per_dataset={
            name: _rate(sum(run[0] for run in set_runs), sum(map(seconds, set_runs)))
            for name, set_runs in runs.items()
        },
        predicted_per_prompt={
            name: [_rate(run[0], seconds(run)) for run in set_runs]
            for name, set_runs in runs.items()
        },
        predicted_step_ms=1000 * total / steps if steps else 0.0,
    )


def step_overhead_of(rows: list[dict]) -> float:
    """Seconds a decoding step costs beside its forward pass: the median over the shapes of
    the measured step time less the curve's (rows predicted without overhead), at least 0.

    The curve times the model alone; a step also builds its mask, verifies, crops the cache
    and updates the proposer, in much the same time whatever the shape. Left out, it favours
    shapes that take more, cheaper steps for the same tokens: SmolLM2 on HumanEval spent about
    2 ms of a 31 ms step there, and W1 N4 G6 (2.79 tokens/step) was predicted ahead of the
    default (2.93), whose steps measured no slower."""
    gaps = [row["measured_step_ms"] - row["predicted_step_ms"] for row in rows]
    return max(statistics.median(gaps), 0.0) / 1000 if gaps else 0.0


# ----------------------------------------------------------------------------- tuning


def tune(config: TuneConfig, progress: Progress | None = None, save: bool = True) -> dict:
    """Measure the curve and the shapes, choose the best, save the profile; return it."""
    model, tokenizer = load_model(config.model, config.dtype, cache_dir=config.cache_dir,
                                  device=config.device)
    packed = apply_packing(model, config.packed_weights)  # tune what the commands will run
    datastore = None
    if config.datastore is not None:
        datastore = load_datastore(config.datastore, tokenizer, cache_dir=config.cache_dir)
    samples = {name: sample_prompts(name, config.limit, config.sample)
               for name in config.datasets}
    prompts = {name: [encode_prompt(tokenizer, p) for p in sample]
               for name, sample in samples.items()}
    curves, token_cost, rows = _measure(model, prompts, config, datastore, progress)
    curve = fastest_curve(curves)
    rows = [predict(reprice(row, curve)) for row in rows]
    overhead = step_overhead_of(rows)
    rows = [predict(row, overhead) for row in rows]
    best = choose_shape(rows, config.select, config.margin)
    profile = dict(
        **_setting(config, model, packed, samples),
        curve=curve,
        curves_measured=curves,
        token_cost=token_cost,  # the first curve's: the shapes ran at it (and its scales)
        step_overhead_ms=1000 * overhead,
        autoregressive_predicted_tokens_per_second=1.0 / cost_at(curve, 1),
        shapes=rows,
        best=shape_of(best),
    )
    if save:
        save_profile(profile, config.cache_dir)
    return profile


def _measure(model, prompts: Mapping[str, list[torch.Tensor]], config: TuneConfig,
             datastore: Datastore | None, progress: Progress | None
             ) -> tuple[list[dict], float, list[dict]]:
    """The forward-cost curve (on the first prompt) measured before and after the shapes, the
    first one's token cost, and a measured row per shape of ``config.shapes`` at that cost
    and each step cap (see :func:`measure_shape`); the default shape, if among them, also at
    the shipped cost, uncapped, as a user gets it untuned (``_runs``)."""
    first = next(iter(prompts.values()))[0]
    _report(progress, 0, 2 + len(config.shapes), "forward-cost curve")
    curve = forward_cost_curve(model, first, config.tokens, config.repeats)
    token_cost = round(token_cost_of(curve), 4)  # the window runs at this machine's price
    runs = _runs(config.shapes, scaled_costs(token_cost, config.cost_scales), config.step_caps)
    total = 2 + len(runs)  # the curve, before the shapes and after them
    rows = []
    for index, (shape, cost, cap) in enumerate(runs, start=1):
        label = shape_label(shape, cap) + (" at the shipped token cost" if cost is None else "")
        _report(progress, index, total, label)
        lookahead.generate(
            model, first, min(config.max_new_tokens, 32), "lookahead", datastore=datastore,
            do_sample=False, **shape_dict(shape)
        )  # warm-up
        rows.append(measure_shape(model, prompts, shape, config.max_new_tokens, curve,
                                  cost, datastore=datastore, step_cap=cap))
    # Measured again, so that a busy spell during either measurement does not price every
    # shape's steps (session 31: 472 ms for one token, on a machine that decoded at 150 ms).
    _report(progress, total - 1, total, "the forward-cost curve again")
    curves = [curve, forward_cost_curve(model, first, config.tokens, config.repeats)]
    _warn_if_apart(curves)
    _report(progress, total, total, "done")
    return curves, token_cost, rows


def _warn_if_apart(curves: list[dict], tolerance: float = 0.2) -> None:
    """Log where two measurements of the curve differ by more than ``tolerance``: the machine
    was busier during one of them, and the fastest is kept."""
    first, again = (np.array(curve["seconds"]) for curve in curves)
    apart = np.abs(first - again) / np.minimum(first, again)
    i = int(apart.argmax())
    if apart[i] > tolerance:
        logger.warning(
            "the forward-cost curve measured before and after the shapes differs by up to "
            "%.0f %% (%d tokens: %.1f against %.1f ms): another job was running; the "
            "faster timings are kept", 100 * apart[i], curves[0]["tokens"][i],
            1000 * first[i], 1000 * again[i],
        )


def scaled_costs(token_cost: float, scales) -> list[float]:
    """The token costs ``token_cost`` times each of ``scales``, at most 1, rounded, distinct and
    ascending."""
    return sorted({round(min(token_cost * x, 1.0), 4) for x in scales})


def _runs(shapes, costs: list[float], caps=(None,)
          ) -> list[tuple[tuple[int, ...], float | None, int | None]]:
    """(shape, token cost, step cap) to measure: every shape at each of ``costs`` with each
    of ``caps``, and before the default shape's rows, where the shapes have it, the default at
    the shipped cost (None) and uncapped, as a user gets it untuned.

    The shipped default is what the tuner must beat: a profile must not differ from what a
    user gets untuned without having beaten it. Session 29's MT-Bench profile kept the default
    shape, found no better, but at the curve's cost (0.064 against 0.025), and ran slower on
    the held-out prompts (0.96x on 12; 1.01x on the 5 where both wrote the same text).
    """
    runs: list[tuple[tuple[int, ...], float | None, int | None]] = []
    for shape in shapes:
        if _is_default(shape_dict(shape)) and (DEFAULT_TOKEN_COST not in costs
                                               or None not in caps):
            runs.append((shape, None, None))
        runs += [(shape, cost, cap) for cost in costs for cap in caps]
    return runs


def _setting(config: TuneConfig, model, packed: bool | str, samples: Mapping[str, list[Prompt]]
             ) -> dict:
    """What a profile was measured on: model, dtype, device, CPU, versions, sample prompts."""
    return dict(
        version=PROFILE_VERSION,
        model=config.model,
        dtype=config.dtype,
        device=model.device.type,
        cpu=torch.backends.cpu.get_cpu_capability(),
        packed_weights=packed,
        threads=torch.get_num_threads(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__,
        transformers=transformers.__version__,
        dataset=config.dataset,
        workload=config.workload,
        datastore=config.datastore,
        prompts=sum(len(sample) for sample in samples.values()),
        sample=config.sample,
        prompt_ids={name: [p.id for p in sample] for name, sample in samples.items()},
        max_new_tokens=config.max_new_tokens,
        select=config.select,
        margin=config.margin,
        cost_scales=list(config.cost_scales),
        step_caps=list(config.step_caps),
    )


def sample_prompts(dataset: str, count: int, sample: str = "spread") -> list[Prompt]:
    """The tuner's ``count`` sample prompts of ``dataset``: spread across it, or its first."""
    prompts = load_prompts(dataset)
    return spread(prompts, count) if sample == "spread" else prompts[:count]


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def choose_shape(rows: list[dict], select: str = "predicted", margin: float = 0.0) -> dict:
    """The row of the fastest shape; the default shape's row instead when it is among them and
    no other clearly leads it.

    With ``select="predicted"`` and per-prompt predictions in the rows, shapes are ranked
    against the default prompt by prompt (``versus_default``): by the geometric mean of their
    predicted speed ratios. A sum over the sample weighs each prompt by its output's length,
    and in bf16 a shape's output can part from the default's after a near tie and run to
    another length (SmolLM2, HumanEval/114: 63 tokens in the default shape, 238 in W1 N5 G3):
    that prompt then decides the sum. A shape replaces the default only if its ratio is above
    ``1 + margin``, at least 1 on every data set (a shape that wins on chat by more than it
    loses on code would make code slower for whoever decodes code), above 1 on more than
    half of the prompts (a lead won on one or two prompts is theirs, not the data set's), and
    its sum leads the default's by more than ``margin`` too: the default is a good shape, and
    is left only where every reading of the sample agrees (SmolLM2 on HumanEval: W1 N4 G6 led
    on all 5 sample prompts, by 12 %, but not in sum, and lost on prompts it had not seen).

    Otherwise (measured timing, or rows without per-prompt figures) the fastest by
    ``{select}_tokens_per_second``, if it leads the default by more than ``margin`` and, when
    predicted, is no slower on any data set (``predicted_per_dataset``).
    """
    default = default_row(rows)
    versus = {id(row): versus_default(row, default) for row in rows} if default else {}
    if select == "predicted" and versus and all(versus.values()):
        eligible = [row for row in rows if versus[id(row)].replaces_default(margin)
                    and _leads(row, default, "predicted_tokens_per_second", margin)]
        return max(eligible, key=lambda row: versus[id(row)].speedup, default=default)
    key = f"{select}_tokens_per_second"
    if default is not None and select == "predicted":
        rows = [row for row in rows if row is default or _no_set_slower(row, default)]
    best = max(rows, key=lambda row: row[key])
    return default if default is not None and not _leads(best, default, key, margin) else best


def _leads(row: Mapping, default: Mapping, key: str, margin: float) -> bool:
    return row[key] > default[key] * (1.0 + margin)


@dataclass(frozen=True)
class Versus:
    """A shape's predicted speed against the default's, prompt by prompt: ``speedup``, the
    geometric mean of the per-prompt ratios; ``per_dataset``, the same within each data set;
    ``won`` of ``prompts``, the prompts on which it is predicted faster."""

    speedup: float
    per_dataset: Mapping[str, float]
    won: int
    prompts: int

    def replaces_default(self, margin: float) -> bool:
        return (self.speedup > 1.0 + margin and 2 * self.won > self.prompts
                and all(ratio >= 1.0 for ratio in self.per_dataset.values()))


def versus_default(row: Mapping, default: Mapping) -> Versus | None:
    """``row`` against ``default`` prompt by prompt (``predicted_per_prompt``: data set ->
    predicted tok/s of each sample prompt), or None where either lacks those figures (a
    profile saved before they were kept) or a rate is 0."""
    ours, theirs = row.get("predicted_per_prompt"), default.get("predicted_per_prompt")
    if not isinstance(ours, Mapping) or not isinstance(theirs, Mapping) or not theirs:
        return None
    ratios: dict[str, list[float]] = {}
    for name, rates in theirs.items():
        if len(ours.get(name, ())) != len(rates) or not all(rates) or not all(ours[name]):
            return None
        ratios[name] = [a / b for a, b in zip(ours[name], rates, strict=True)]
    every = [ratio for values in ratios.values() for ratio in values]
    return Versus(
        speedup=statistics.geometric_mean(every),
        per_dataset={name: statistics.geometric_mean(values) for name, values in ratios.items()},
        won=sum(ratio > 1.0 for ratio in every),
        prompts=len(every),
    )


def shape_of(row: Mapping) -> dict[str, float]:
    """The ``lookahead.generate`` keywords of a profile's ``best`` or a tuning row: (W, N, G),
    which must be there (else KeyError), and the lookup length, token cost and step cap
    (``max_step_tokens``) where given."""
    shape = {key: row[key] for key in SHAPE_KEYS[:3]}
    optional = (*SHAPE_KEYS[3:], "token_cost", STEP_KEY)
    return shape | {key: row[key] for key in optional if row.get(key) is not None}


def split_cap(shape: Mapping) -> tuple[dict, int | None]:
    """``shape`` (``shape_of``'s keywords) as its ``LookaheadConfig`` fields and its step cap
    (``max_step_tokens``, None where it has none)."""
    fields = dict(shape)
    return fields, check_step_tokens(fields.pop(STEP_KEY, None))


def _is_default(row: Mapping) -> bool:
    """Whether a shape or tuning row is the default shape at the shipped token cost, with
    no step cap."""
    return all(row[k] == v for k, v in DEFAULT_SHAPE.items()) and (
        row.get("lookup_tokens", DEFAULT_LOOKUP_TOKENS) == DEFAULT_LOOKUP_TOKENS
    ) and row.get("token_cost", DEFAULT_TOKEN_COST) == DEFAULT_TOKEN_COST and (
        row.get(STEP_KEY) is None
    )


def shape_dict(shape) -> dict[str, int]:
    """``(W, N, G)`` or ``(W, N, G, lookup_tokens)`` as ``lookahead.generate`` keywords; the
    lookup length is the default's when left out."""
    return dict(zip(SHAPE_KEYS, (*shape, DEFAULT_LOOKUP_TOKENS)[:4], strict=True))


def shape_label(shape, cap: int | None = None) -> str:
    """The label "W=2 N=5 G=4", with " L=16" where the lookup length is not the default's and
    " T=6" where a step feeds at most 6 tokens (``cap``, or the shape's ``max_step_tokens``)."""
    options = shape_dict(shape) if not isinstance(shape, Mapping) else shape
    label = "W={window} N={ngram} G={guess}".format(**options)
    lookup = options.get("lookup_tokens", DEFAULT_LOOKUP_TOKENS)
    label += f" L={lookup}" if lookup != DEFAULT_LOOKUP_TOKENS else ""
    cap = cap if cap is not None else options.get(STEP_KEY)
    return label + (f" T={cap}" if cap is not None else "")


def _no_set_slower(row: dict, default: dict) -> bool:
    ours, theirs = row.get("predicted_per_dataset", {}), default.get("predicted_per_dataset", {})
    return all(ours.get(name, 0.0) >= rate for name, rate in theirs.items())


def default_row(rows: list[dict]) -> dict | None:
    """The row of the default shape among tuning rows, or None."""
    return next((row for row in rows if _is_default(row)), None)


def _report(progress: Progress | None, done: int, total: int, description: str) -> None:
    if progress is not None:
        progress(done, total, description)


# ----------------------------------------------------------------------------- profiles


def _measured_alike(profile: dict | None, packed: bool | str | None) -> dict | None:
    """``profile``, or None where its curve was measured on weights packed otherwise than
    ``packed`` (None: not known, any will do). Packed float32 makes a pass of 8 tokens cost
    1.75-1.9x one on an AVX2 CPU, plain float32 about 2x at 2 tokens and no more up to 16,
    the stream kernel about 1.25x: each has its own best shape."""
    recorded = None if profile is None else profile.get("packed_weights")
    if packed is None or recorded is None or recorded == packed:
        return profile
    logger.info("passing over the tuning profile of %s: measured on %s weights, these are %s",
                profile.get("model"), *(_packing_label(p) for p in (recorded, packed)))
    return None


def _packing_label(packed: bool | str) -> str:
    """"plain", "packed" or "stream": how a profile's file and messages name its weights."""
    return packed if isinstance(packed, str) else "packed" if packed else "plain"


def profile_path(model_name: str, dtype, device: str = "cpu", cache_dir=None,
                 workload: str | None = None, packed: bool | str = False) -> Path:
    """``<cache_dir>/profiles/<model>-<dtype>[-packed|-stream]-<device>[-<workload>].json``;
    the model name made file-safe. Plain, packed and stream-kernel weights have a profile
    each: their curves differ."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", str(model_name)).strip("_.") or "model"
    packing = f"-{_packing_label(packed)}" if packed else ""
    suffix = f"-{check_workload(workload)}" if workload is not None else ""
    return root / "profiles" / f"{safe}-{dtype_name(dtype)}{packing}-{device}{suffix}.json"


def saved_profile_path(profile: dict, cache_dir=None) -> Path:
    """Where :func:`save_profile` writes ``profile``: named by its model, dtype, packing,
    device and workload."""
    return profile_path(profile["model"], profile["dtype"], profile["device"], cache_dir,
                        profile.get("workload"), profile.get("packed_weights") or False)


def save_profile(profile: dict, cache_dir=None) -> Path:
    """Write the profile JSON (atomically) and a PNG of its curve beside it; return the JSON."""
    from lookahead.bench.plots import plot_cost_curve

    path = saved_profile_path(profile, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(profile, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    plot_cost_curve(profile, path.with_suffix(".png"))
    logger.info("saved the tuning profile %s", path)
    return path


def load_profile(model_name: str, dtype, cache_dir=None, device: str = "cpu",
                 workload: str | None = None, packed: bool | str | None = None) -> dict | None:
    """The saved profile of ``model_name`` in ``dtype`` on ``device`` (for ``workload``, if
    named: that one only) measured on weights packed as ``packed`` says, or None.

    ``packed=None`` (not known) takes the plain weights' profile, else the packed one. A profile
    saved before packed weights had a file of their own is read for the packing it records. A
    profile that cannot be read, or whose best shape is invalid, is ignored with a warning.
    """
    candidates = ((False, True) if packed is None else (packed,) if isinstance(packed, str)
                  else (True, False) if packed else (False,))
    for candidate in candidates:
        path = profile_path(model_name, dtype, device, cache_dir, workload, candidate)
        profile = _measured_alike(_read_profile(path), packed)
        if profile is not None:
            return profile
    return None


def _read_profile(path: Path) -> dict | None:
    """The profile JSON at ``path`` if it exists and names a valid best shape, else None."""
    if not path.is_file():
        return None
    try:
        profile = json.loads(path.read_text(encoding="utf-8"))
        fields, _ = split_cap(shape_of(profile["best"]))
        LookaheadConfig(**fields)
    except (OSError, ValueError, TypeError, KeyError) as error:
        logger.warning("ignoring the unreadable tuning profile %s (%s)", path, error)
        return None
    return profile


def resolve_shape(model_name: str, dtype, cache_dir=None, device: str = "cpu",
                  workload: str | None = None, packed: bool | str | None = None
                  ) -> dict[str, float]:
    """``dict(window=, ngram=, guess=[, lookup_tokens=, token_cost=, max_step_tokens=])``: the
    tuned best for this model, dtype and device (from the ``workload`` profile if one is named
    and saved, else the general one), else ``default_shape(device)``. Run ``lookahead tune
    --model NAME --dtype DTYPE [--workload W]`` to create a profile. ``packed``: whether the
    weights are packed (None: not known); only a profile measured on weights packed alike is
    taken."""
    profile = None
    if workload is not None:
        profile = load_profile(model_name, dtype, cache_dir, device, workload, packed)
        if profile is None:
            logger.info("no %r tuning profile for %s; trying the general one", workload,
                        model_name)
    if profile is None:
        profile = load_profile(model_name, dtype, cache_dir, device, packed=packed)
    if profile is None:
        logger.info("no tuning profile for %s (%s); using the default shape", model_name, dtype)
        return default_shape(device)
    return shape_of(profile["best"])


def default_shape(device: str) -> dict[str, float]:
    """The untuned shape on a device type: ``GPU_DEFAULT_SHAPE`` on CUDA, else
    ``DEFAULT_SHAPE`` (whose window runs while it pays at the shipped token cost)."""
    return dict(GPU_DEFAULT_SHAPE if device == "cuda" else DEFAULT_SHAPE)
