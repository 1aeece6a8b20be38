"""What a step of k tokens costs on this CPU: measured once, at first use, and cached.

Lookahead prices its candidates on ``LookaheadConfig.step_costs``, what a forward pass of 1, 2,
3, ... tokens costs relative to one. ``lookahead tune`` measures that curve with the shapes
(minutes); without a tuned profile a CPU call measures the curve alone instead
(``measured_curve``: passes of 1, 2, 3, 4, 6, 8, 12, 16 tokens after ~200 cached ones of the
real model, a few repeats, seconds), caches it per model, weights, CPU and thread count
(``<cache>/step_costs/<model>-<dtype>[-<kernel>]-<device>-<cpu>-<threads>t.json``), and
``measured_shape`` prices the default shape on it: the curve's step costs, its token cost, and
the step cap past which even a candidate that is always right cannot pay (``step_cap_of``).
Each request then moves the costs to what its own passes measure (``proposers.step_clock``).

``forward_cost_curve`` is the tuner's measurement too (``lookahead.bench.cost_curve``).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from lookahead import cache_files
from lookahead.attention import attention_mask, decoding_attention, mask_to
from lookahead.cache import cache_keyword, new_cache
from lookahead.config import LookaheadConfig
from lookahead.kernels.packing import packing_of
from lookahead.kernels.quant_linear import cpu_name
from lookahead.profiles import (
    DEFAULT_TOKEN_COST,
    STEP_KEY,
    cost_at,
    default_shape,
    profile_path,
    step_costs_of,
)

logger = logging.getLogger(__name__)

# The sizes a first-use measurement times: a step of the default shape feeds 1-16 tokens.
MEASURED_TOKENS = (1, 2, 3, 4, 6, 8, 12, 16)
# Cached tokens the passes attend to, and timed rounds after the warm-up round: on
# Qwen2.5-Coder-1.5B Q4_K_M with 2 threads (about 30 ms a one-token pass) some 4 s in all.
MEASURED_PROMPT_TOKENS = 200
MEASURED_REPEATS = 4
# Seconds after which no further repeat starts: on a machine busy with other jobs a pass can
# take ten times its time (two threads waiting on each other), and the first call must not.
MEASURE_BUDGET = 5.0
# 2: the quantized kernel's prefetch hint follows the CPU (about 1.4x on an Intel Xeon), so
# curves measured before no longer price its steps. 3: its prefetch distance is measured per
# CPU (``lookahead.kernels.prefetch``; a one-token pass 1.2x faster on a Xeon of model 167).
# 4: it may ask for them to L2 far ahead and to L1 near (passes of two rows 1.15x faster there).
CURVE_VERSION = 4
# ``GenerationStats.shape_source`` of a shape priced on a measured curve: this, then its file.
MEASURED_SOURCE = "measured"


@torch.inference_mode()
def forward_cost_curve(model, input_ids: torch.Tensor, tokens, repeats: int = 5,
                       budget: float | None = None, statistic=statistics.median) -> dict:
    """Median seconds of one forward pass with k new tokens after the cached ``input_ids``
    (LongTensor [1, L]).

    The k tokens attend causally through an explicit 4D mask, as a lookahead step's do (k = 1
    goes without a mask, as a plain decoding step does); every row's logits are computed. The
    sizes are interleaved within each repeat so that a slow spell hits all of them alike.
    ``budget``: seconds after which no further repeat starts (at least one is timed);
    ``statistic``: what a size's timings are reduced to (the median, or ``min``).

    Returns ``dict(tokens=[k...], seconds=[median...], prompt_tokens=L)``.
    """
    device = model.device
    with decoding_attention(device):  # as our decoding has it, and its cache
        return _cost_curve(model, input_ids.to(device), tokens, repeats, new_cache(), budget,
                           statistic)


def _cost_curve(model, input_ids: torch.Tensor, tokens, repeats: int, cache,
                budget: float | None = None, statistic=statistics.median) -> dict:
    """``forward_cost_curve`` with ``input_ids`` [1, L] on the model's device, into ``cache``."""
    started = time.perf_counter()
    keyword, device = cache_keyword(model), model.device
    model(input_ids=input_ids, **{keyword: cache}, use_cache=True, logits_to_keep=1)
    past = cache.get_seq_length()
    prompt = input_ids[0]
    timings: dict[int, list[float]] = {k: [] for k in tokens}
    for repeat in range(repeats + 1):  # the first round warms up
        if repeat > 1 and budget is not None and time.perf_counter() - started > budget:
            break  # a busy machine: fewer repeats rather than a long wait
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
        seconds=monotone([statistic(timings[k]) for k in tokens]),
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


def token_cost_of(curve: Mapping, up_to: int = 32) -> float:
    """What one more token costs as a fraction of a one-token pass (``LookaheadConfig.
    token_cost``): the least-squares slope of the curve over sizes up to ``up_to`` (where a
    lookahead step's live), over the cost of one token; in [0, 1]."""
    points = [(k, s) for k, s in zip(curve["tokens"], curve["seconds"]) if k <= up_to]
    if len(points) < 2:
        return DEFAULT_TOKEN_COST
    slope = float(np.polyfit(*zip(*points), deg=1)[0])
    return min(max(slope / cost_at(curve, 1), 0.0), 1.0)


def step_cap_of(costs, tolerance: float = 0.01) -> int | None:
    """The most tokens a step may feed on ``costs`` (``step_costs``: steps of 1, 2, ... tokens
    relative to one): the smallest size whose cost per token is within ``tolerance`` of the
    least, or None where that is the last size (the curve, extended as it was, goes on
    falling past it).

    A candidate's token pays where ``(e + q) / cost(t + 1) > e / cost(t)`` (``DepthGauge.
    priced_depths``: ``e`` the tokens a step of ``t`` tokens is expected to commit, ``q`` the
    new token's rate). At best every token is right (``q = 1``, ``e = t``) and a step commits
    ``t / cost(t)`` per unit of time: a longer step than the size where that is greatest
    commits no more, however good its candidates. The least over the whole curve, not the
    first size where the cost per token rises, so that one noisy size does not cap every
    step; the smallest within ``tolerance``, as tokens that gain less cannot pay for a
    candidate that is sometimes wrong.
    """
    per_token = [cost / size for size, cost in enumerate(costs, start=1)]
    if len(per_token) < 2:
        return None
    least = min(per_token)
    size = next(i for i, cost in enumerate(per_token, start=1) if cost <= least * (1 + tolerance))
    return None if size == len(per_token) else size


def curve_path(model_name: str, dtype, device: str, kernel, cpu: str, threads: int,
               cache_dir=None) -> Path:
    """``<cache_dir>/step_costs/<model>-<dtype>[-<kernel>]-<device>-<cpu>-<threads>t.json``:
    named as the model's tuning profile is (``profiles.profile_path``), and by the CPU's
    name and the thread count, both of which change the curve."""
    profile = profile_path(model_name, dtype, device, cache_dir, packed=kernel)
    safe_cpu = cache_files.safe_name(cpu, "cpu")
    return profile.parent.parent / "step_costs" / f"{profile.stem}-{safe_cpu}-{threads}t.json"


def measured_curve(model, cache_dir=None, cpu: str | None = None, threads: int | None = None
                   ) -> tuple[dict, Path]:
    """The forward-cost curve of ``model`` on this CPU (``forward_cost_curve``'s dict) and the
    file it is cached in: read from that file, else measured now (a few seconds; logged)
    and written there. ``cpu`` and ``threads``: the CPU's name and torch's thread count
    (None: this machine's, ``cpu_name()`` and ``torch.get_num_threads()``). A cached file
    that cannot be read, or was measured on another model of the same name, is measured
    again (with a warning where it is unreadable)."""
    cpu = cpu_name() if cpu is None else cpu
    threads = torch.get_num_threads() if threads is None else threads
    setting = dict(version=CURVE_VERSION, model=str(model.name_or_path),
                   architecture=_architecture(model), cpu=cpu, threads=threads)
    # A model built in memory has no name: its architecture tells it from another.
    name = str(model.name_or_path) or "unnamed-" + "-".join(map(str, setting["architecture"]))
    path = curve_path(name, model.dtype, model.device.type, packing_of(model), cpu, threads,
                      cache_dir)
    curve = _read_curve(path, setting)
    if curve is not None:
        return curve, path
    logger.warning("measuring this CPU's step costs once (a few seconds); cached in %s", path)
    started = time.perf_counter()
    curve = measure_curve(model)
    took = time.perf_counter() - started
    logger.info("measured the step costs in %.1f s: %s", took, step_costs_of(curve))
    if took > 4 * MEASURE_BUDGET:
        # Seen with Qwen2.5-Coder-1.5B while another process was building the kernels: 2 s a
        # pass whatever its size, 36 s in all, against 2.2 s a minute later. Kept, that curve
        # would price every later call; this call uses it, the next measures again.
        logger.warning("the step costs took %.0f s to measure: the machine was busy; not "
                       "cached, measured again next time", took)
        return curve, path
    _write_curve(path, setting | dict(torch=torch.__version__, curve=curve))
    return curve, path


def measure_curve(model, tokens=MEASURED_TOKENS, prompt_tokens: int = MEASURED_PROMPT_TOKENS,
                  repeats: int = MEASURED_REPEATS, budget: float = MEASURE_BUDGET) -> dict:
    """``forward_cost_curve`` of ``model`` after ``prompt_tokens`` cached tokens (fewer where
    the model's context is short): random ids of its vocabulary, as a pass costs the same
    whatever the tokens. ``tokens`` must start at 1."""
    context = getattr(model.config, "max_position_embeddings", None) or prompt_tokens + 64
    length = max(min(prompt_tokens, context - max(tokens) - 1), 1)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(model.config.vocab_size, (1, length), generator=generator)
    # The fastest of the few repeats: another job only ever adds time (the tuner, too, keeps
    # the faster of its two curves), and on a busy machine a median of four can be all spells.
    curve = forward_cost_curve(model, ids, tokens, repeats, budget, statistic=min)
    # A pass of k tokens never costs more than k passes of one (it reads the weights once);
    # a timing that says so caught another job's spell, and would price out every candidate.
    one = curve["seconds"][0]
    curve["seconds"] = [min(seconds, k * one) for k, seconds in zip(tokens, curve["seconds"])]
    return curve


def _architecture(model) -> list:
    """What tells two models of one name apart: kind, vocabulary, width, depth."""
    config = model.config
    names = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
    return [getattr(config, name, None) for name in names]


def _read_curve(path: Path, setting: Mapping) -> dict | None:
    """The curve cached at ``path`` if it is there, readable and measured in ``setting``."""
    if not path.is_file():
        return None
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
        curve = cached["curve"]
        if step_costs_of(curve) is None or len(curve["seconds"]) != len(curve["tokens"]):
            raise ValueError("no curve from one token up")
        LookaheadConfig(step_costs=step_costs_of(curve))  # finite, from 1, never falling
    except (OSError, ValueError, TypeError, KeyError, IndexError) as error:
        logger.warning("measuring again: the cached step costs %s cannot be read (%s)",
                       path, error)
        return None
    if any(cached.get(key) != value for key, value in setting.items()):
        logger.info("measuring again: %s was measured for another model or version", path)
        return None
    return curve


def _write_curve(path: Path, record: dict) -> None:
    """Write ``record`` to ``path`` atomically (``cache_files.write_json``)."""
    try:
        cache_files.write_json(path, record)
    except OSError as error:  # a read-only cache: the curve still prices this call
        logger.warning("could not cache the step costs in %s (%s)", path, error)


def measured_shape(model, cache_dir=None, cpu: str | None = None, threads: int | None = None
                   ) -> tuple[dict, str]:
    """``(shape, source)``: the default shape priced on this CPU's measured curve
    (``measured_curve``) -- its ``step_costs``, its ``token_cost`` and, where the cost per
    token stops falling, a ``max_step_tokens`` cap (``step_cap_of``) -- and
    ``"measured: <the cached curve's path>"``."""
    curve, path = measured_curve(model, cache_dir, cpu, threads)
    costs = step_costs_of(curve)
    shape = default_shape(model.device.type) | dict(
        token_cost=round(token_cost_of(curve), 4), step_costs=costs)
    cap = step_cap_of(costs)
    if cap is not None:
        shape[STEP_KEY] = cap
    return shape, f"{MEASURED_SOURCE}: {path}"
