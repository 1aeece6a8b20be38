"""The forward-cost curve and the speeds it predicts."""


from __future__ import annotations

import pytest
from lookahead.bench.cost_curve import (
    cost_at,
    fastest_curve,
    monotone,
    predict,
    reprice,
    step_overhead_of,
    token_cost_of,
)
from lookahead.config import LookaheadConfig


def test_cost_curve_interpolates_and_extends() -> None:
    curve = dict(tokens=[1, 4, 8], seconds=[0.010, 0.010, 0.018])
    assert cost_at(curve, 1) == pytest.approx(0.010)
    assert cost_at(curve, 6) == pytest.approx(0.014)
    assert cost_at(curve, 16) == pytest.approx(0.034)  # along the last segment
    assert cost_at(dict(tokens=[2], seconds=[0.02]), 4) == pytest.approx(0.04)


def test_token_cost_is_the_curves_slope_over_one_token() -> None:
    tokens = [1, 4, 8, 16, 32, 64]
    seconds = [0.040 + 0.001 * (k - 1) for k in tokens[:-1]] + [0.5]  # 64: beyond a step's size
    assert token_cost_of(dict(tokens=tokens, seconds=seconds)) == pytest.approx(0.025)
    assert token_cost_of(dict(tokens=[1, 8, 16], seconds=[0.01] * 3)) == 0.0  # free tokens
    assert token_cost_of(dict(tokens=[1, 2], seconds=[0.01, 0.05])) == 1.0  # at most 1
    assert token_cost_of(dict(tokens=[1], seconds=[0.01])) == LookaheadConfig().token_cost


def test_cost_curve_is_made_non_decreasing() -> None:
    assert monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    # 16 tokens timed cheaper than 8 is noise: both become their mean, the rest is kept.
    assert monotone([0.05, 0.08, 0.06, 0.09]) == pytest.approx([0.05, 0.07, 0.07, 0.09])
    assert monotone([0.04, 0.03, 0.02]) == pytest.approx([0.03, 0.03, 0.03])


def test_the_curve_keeps_each_size_fastest_timing_made_non_decreasing() -> None:
    busy_first = dict(tokens=[1, 2, 4], seconds=[0.30, 0.31, 0.40], prompt_tokens=9)
    busy_later = dict(tokens=[1, 2, 4], seconds=[0.10, 0.12, 0.35], prompt_tokens=9)
    assert fastest_curve([busy_first, busy_later]) == dict(
        tokens=[1, 2, 4], seconds=[0.10, 0.12, 0.35], prompt_tokens=9
    )
    # Each size's fastest may dip below a smaller size's: pooled, as one curve is.
    dip = dict(tokens=[1, 2, 4], seconds=[0.20, 0.13, 0.50], prompt_tokens=9)
    assert fastest_curve([busy_first, dip])["seconds"] == pytest.approx([0.165, 0.165, 0.40])


def test_a_run_is_repriced_on_another_curve_from_its_forward_sizes() -> None:
    slow = dict(tokens=[1, 4], seconds=[0.3, 0.6], prompt_tokens=9)
    fast = dict(tokens=[1, 4], seconds=[0.1, 0.2], prompt_tokens=9)
    # 12 tokens in 6 steps: 4 passes of 1 token and 2 of 4 (priced on the slow curve).
    run = [12, 6, 4 * 0.3 + 2 * 0.6, [[1, 4], [4, 2]]]
    row = predict(dict(measured_step_ms=150.0, prompt_runs=dict(set=[run])))
    assert row["predicted_step_ms"] == pytest.approx(400.0)  # slower than it ran
    again = predict(reprice(row, fast))
    assert again["prompt_runs"]["set"][0][2] == pytest.approx(4 * 0.1 + 2 * 0.2)
    assert again["predicted_step_ms"] == pytest.approx(800.0 / 6)
    assert again["predicted_tokens_per_second"] == pytest.approx(12 / 0.8)


def test_step_overhead_is_the_median_gap_and_counts_per_step() -> None:
    def row(measured_ms, runs):
        return predict(dict(measured_step_ms=measured_ms, prompt_runs=dict(set=runs)))

    # [tokens, steps, forward seconds]: 3 tokens/step in 10 ms steps; 2.6 in 8.5 ms steps.
    wide = row(12.0, [[30, 10, 0.100]])
    narrow = row(11.0, [[26, 10, 0.085]])
    spare = row(9.0, [[10, 10, 0.050]])  # measured 4 ms over its 5 ms steps
    assert wide["predicted_step_ms"] == pytest.approx(10.0)
    # On the forward cost alone the narrow shape looks faster.
    assert narrow["predicted_tokens_per_second"] > wide["predicted_tokens_per_second"]
    # The gaps are 2, 2.5 and 4 ms: the median, 2.5 ms, is the overhead of every step.
    overhead = step_overhead_of([wide, narrow, spare])
    assert overhead == pytest.approx(0.0025)
    wide, narrow = predict(wide, overhead), predict(narrow, overhead)
    assert wide["predicted_per_prompt"] == {"set": [pytest.approx(30 / 0.125)]}
    assert wide["predicted_step_ms"] == pytest.approx(12.5)
    # With it, the narrow shape's extra steps cost it: 26 / 0.110 s against 30 / 0.125 s.
    assert narrow["predicted_tokens_per_second"] == pytest.approx(26 / 0.110)
    assert wide["predicted_tokens_per_second"] > narrow["predicted_tokens_per_second"]
    # Steps measured faster than the curve says: no negative overhead.
    assert step_overhead_of([row(9.0, [[30, 10, 0.100]])]) == 0.0
