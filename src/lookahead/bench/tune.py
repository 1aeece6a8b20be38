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
4. saves a profile ``<cache>/profiles/<model>-<dtype>[-packed|-stream]-<device>.json`` and a PNG
   of the curve. Each kernel of the linear layers (plain, packed, stream) keeps a profile:
   the kernel changes the curve, and so the best shape.

``lookahead.profiles.resolve_shape(model, dtype, packed=Kernel...)`` then gives the saved best shape
(or ``DEFAULT_SHAPE``); ``lookahead.generate(..., window="auto")`` and the commands, when no
window is given, use it. The curve's measuring and pricing live in ``bench.cost_curve``, the
shapes tried and the rule that keeps one in ``bench.shape_search``.

A *workload* profile (``TuneConfig(workload="code", dataset="humaneval")``, saved as
``<model>-<dtype>-<device>-code.json``) is tuned on one kind of text only: the best shape for
code need not be the best for chat. ``resolve_shape(..., workload="code")`` reads it, and falls
back to the general profile where there is none.

Example::

    profile = tune(TuneConfig(model="smollm2-135m", dtype="bfloat16"))
    shape = lookahead.profiles.resolve_shape("smollm2-135m", "bfloat16")  # {"window": 7, ...}
    lookahead.generate(model, input_ids, method="lookahead", **shape)
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers

import lookahead
from lookahead import cache_files
from lookahead.bench.cost_curve import (
    DEFAULT_TOKENS,
    cost_at,
    fastest_curve,
    forward_cost_curve,
    forward_seconds,
    predict,
    rate_of,
    reprice,
    step_overhead_of,
    token_cost_of,
    warn_if_apart,
)
from lookahead.bench.datasets import Prompt, encode_prompt, load_prompts, spread
from lookahead.bench.shape_search import (
    DEFAULT_SHAPES,
    SELECT,
    choose_shape,
    scaled_costs,
    shape_runs,
)
from lookahead.config import LookaheadConfig, check_int, check_workload
from lookahead.kernels.choice import Kernel, as_kernel
from lookahead.kernels.packing import apply_packing, check_packable_dtype
from lookahead.models.load import load_model
from lookahead.models.registry import (
    AUTO_DTYPE,
    DEFAULT_MODEL,
    dtype_name,
    resolve_dtype,
)
from lookahead.profiles import (
    PROFILE_VERSION,
    STEP_KEY,
    saved_profile_path,
    shape_dict,
    shape_label,
    shape_of,
    step_costs_of,
)
from lookahead.sources.datastore import Datastore, check_spec, load_datastore

logger = logging.getLogger(__name__)

SAMPLES = ("spread", "first")
DEFAULT_DATASETS = "humaneval,mtbench,gsm8k"

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
    ``packed_weights``: the kernel of the linear layers to tune on, as the commands run them
    (``Kernel.PLAIN``, ``PACKED``, ``STREAM``, or a spelling ``as_kernel`` reads: True,
    False, "stream"), or None: packed where the model allows it (``apply_packing``).
    ``datastore``: the shapes also copy from this corpus ("stdlib", "python" or a file or folder
    of text, see ``load_datastore``), as the commands run with ``--datastore``: the copies it
    adds are forward tokens too, and can move the best shape. ``cost_scales``: each shape runs
    at the curve's token cost times each of these, so that the token cost is chosen with the
    shape (the curve's one slope can under- or overstate what the tokens a step feeds cost; see
    ``shape_runs``). ``step_caps``: each shape also runs with each of these caps on the tokens a
    step feeds (``max_step_tokens``; None: no cap), so that the cap is chosen with the shape:
    the curve bends, and where 8 tokens cost far more than 6 a capped step can be the faster
    one."""

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
    packed_weights: Kernel | None = None
    datastore: str | None = None
    cost_scales: tuple[float, ...] = (1.0,)
    step_caps: tuple[int | None, ...] = (None,)
    device: str | None = None  # where the model runs (None: the CPU)

    def __post_init__(self) -> None:
        if self.dtype != AUTO_DTYPE:  # "auto" stays: on a GGUF model it means quantized
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
        kernel = as_kernel(self.packed_weights, "packed_weights",
                           (Kernel.PLAIN, Kernel.PACKED, Kernel.STREAM))
        object.__setattr__(self, "packed_weights", kernel)
        check_packable_dtype(kernel, resolve_dtype(self.dtype))
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
    if token_cost is not None:  # the tuned price: candidates cut on the curve, as they will be
        options["token_cost"] = token_cost
        costs = step_costs_of(curve)
        if costs is not None:
            options["step_costs"] = costs
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
                               forward_seconds(curve, sizes), [list(n) for n in sizes]])
    every = [run for set_runs in runs.values() for run in set_runs]
    new, steps = sum(run[0] for run in every), sum(run[1] for run in every)
    row = dict(
        **options,
        tokens_per_step=new / steps if steps else 1.0,
        mean_forward_tokens=sum(forward) / len(forward) if forward else 1.0,
        measured_tokens_per_second=rate_of(new, decode_seconds),
        measured_step_ms=1000 * decode_seconds / steps if steps else 0.0,
        prompt_runs=runs,
    )
    return predict(row, step_overhead)


def tune(config: TuneConfig, progress: Progress | None = None, save: bool = True) -> dict:
    """Measure the curve and the shapes, choose the best, save the profile; return it."""
    # As the commands load it: a GGUF model quantized unless the kernel packs float weights.
    kernel = config.packed_weights
    model, tokenizer = load_model(config.model, config.dtype, cache_dir=config.cache_dir,
                                  device=config.device,
                                  quantized=False if kernel is not None and kernel.packs else None)
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
    the shipped cost, uncapped, as a user gets it untuned (``shape_runs``)."""
    first = next(iter(prompts.values()))[0]
    _report(progress, 0, 2 + len(config.shapes), "forward-cost curve")
    curve = forward_cost_curve(model, first, config.tokens, config.repeats)
    token_cost = round(token_cost_of(curve), 4)  # the window runs at this machine's price
    runs = shape_runs(config.shapes, scaled_costs(token_cost, config.cost_scales), config.step_caps)
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
    # shape's steps (one curve read 472 ms for one token on a machine that decoded at 150 ms).
    _report(progress, total - 1, total, "the forward-cost curve again")
    curves = [curve, forward_cost_curve(model, first, config.tokens, config.repeats)]
    warn_if_apart(curves)
    _report(progress, total, total, "done")
    return curves, token_cost, rows


def _setting(config: TuneConfig, model, packed: Kernel, samples: Mapping[str, list[Prompt]]
             ) -> dict:
    """What a profile was measured on: model, dtype, device, CPU, versions, sample prompts."""
    return dict(
        version=PROFILE_VERSION,
        model=config.model,
        dtype=dtype_name(model.dtype),
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


def _report(progress: Progress | None, done: int, total: int, description: str) -> None:
    if progress is not None:
        progress(done, total, description)


def save_profile(profile: dict, cache_dir=None) -> Path:
    """Write the profile JSON (atomically) and a PNG of its curve beside it; return the JSON."""
    from lookahead.bench.plots import plot_cost_curve

    path = saved_profile_path(profile, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own: two tuners writing the same profile must not share a temporary.
    tmp = cache_files.temporary_name(path)
    tmp.write_text(json.dumps(profile, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    plot_cost_curve(profile, path.with_suffix(".png"))
    logger.info("saved the tuning profile %s", path)
    return path


