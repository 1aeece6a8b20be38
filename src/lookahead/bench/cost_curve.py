"""The forward-cost curve: what one forward pass of k new tokens costs on this machine, and
the decoding speed it predicts for a measured run.

``forward_cost_curve`` times passes of ``k`` tokens on top of a cached prompt (seconds, a
median per k); ``cost_at`` reads it between the measured sizes; ``predict`` turns a run's
per-step forward tokens into a predicted tokens/second. ``lookahead tune`` (``bench.tune``)
measures the curve and ranks shapes by it (``bench.shape_search``).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping

import numpy as np
import torch

from lookahead.attention import attention_mask, decoding_attention, mask_to
from lookahead.cache import cache_keyword, new_cache
from lookahead.profiles import DEFAULT_TOKEN_COST, cost_at

logger = logging.getLogger(__name__)


DEFAULT_TOKENS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96)


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


def token_cost_of(curve: Mapping, up_to: int = 32) -> float:
    """What one more token costs as a fraction of a one-token pass (``LookaheadConfig.
    token_cost``): the least-squares slope of the curve over sizes up to ``up_to`` (where a
    lookahead step's live), over the cost of one token; in [0, 1]."""
    points = [(k, s) for k, s in zip(curve["tokens"], curve["seconds"]) if k <= up_to]
    if len(points) < 2:
        return DEFAULT_TOKEN_COST
    slope = float(np.polyfit(*zip(*points), deg=1)[0])
    return min(max(slope / cost_at(curve, 1), 0.0), 1.0)


def forward_seconds(curve: Mapping, sizes) -> float:
    """The curve's seconds for the forward passes of ``sizes``, [(k, passes of k tokens)]."""
    return sum(cost_at(curve, k) * count for k, count in sizes)


def reprice(row: dict, curve: Mapping) -> dict:
    """``row`` with each prompt run's forward seconds read off ``curve`` instead (not yet
    ``predict``-ed again)."""
    runs = {name: [[*run[:2], forward_seconds(curve, run[3]), run[3]] for run in set_runs]
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
        predicted_tokens_per_second=rate_of(sum(run[0] for run in every), total),
        predicted_per_dataset={
            name: rate_of(sum(run[0] for run in set_runs), sum(map(seconds, set_runs)))
            for name, set_runs in runs.items()
        },
        predicted_per_prompt={
            name: [rate_of(run[0], seconds(run)) for run in set_runs]
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


def warn_if_apart(curves: list[dict], tolerance: float = 0.2) -> None:
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


def rate_of(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0
