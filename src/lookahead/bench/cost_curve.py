"""The forward-cost curve: what one forward pass of k new tokens costs on this machine, and
the decoding speed it predicts for a measured run.

``forward_cost_curve`` times passes of ``k`` tokens on top of a cached prompt (seconds, a
median per k; ``lookahead.step_costs``, where a call without a tuned profile measures its
own); ``cost_at`` reads it between the measured sizes; ``predict`` turns a run's
per-step forward tokens into a predicted tokens/second. ``lookahead tune`` (``bench.tune``)
measures the curve and ranks shapes by it (``bench.shape_search``).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping

import numpy as np

from lookahead.profiles import cost_at

# The measurement itself is the library's, which also measures a curve at first use.
from lookahead.step_costs import (  # noqa: F401 (the tuner's and scripts' names for them)
    causal_step,
    forward_cost_curve,
    monotone,
    synchronize,
    token_cost_of,
)

logger = logging.getLogger(__name__)


DEFAULT_TOKENS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96)


def fastest_curve(curves: list[dict]) -> dict:
    """Curves measured at different times, as one: each size's fastest median, made
    non-decreasing. Another job only ever adds time, so the fastest timing is the closest to
    the machine's own."""
    seconds = [min(values) for values in zip(*(curve["seconds"] for curve in curves))]
    return curves[0] | dict(seconds=monotone(seconds))


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
