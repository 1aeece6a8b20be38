"""``BudgetPolicy``: the tokens a step gives each request, from a fixed rule to what the
measured steps say pays best, on made-up step costs and gains."""

from __future__ import annotations

import pytest

from lookahead.server.budget import BudgetPolicy


def test_budget_ceiling_is_the_fixed_rule() -> None:
    policy = BudgetPolicy(64, adaptive=False)
    assert [policy.choose(["lookahead"] * n) for n in (1, 2, 8, 100)] == [64, 32, 8, 1]
    assert BudgetPolicy(64).levels(5) == [1, 2, 4, 8, 12]


def test_budget_policy_settles_on_the_share_that_pays_best() -> None:
    """8 requests; a step costs 50 ms + 1 ms per token; a share of k tokens commits gain[k]
    tokens per request: 8 * gain / cost is best at k = 4 (8 * 2.0 / 0.082 = 195 tokens/s)."""
    policy = BudgetPolicy(64, explore=0.1, seed=1)
    gain = {1: 1.0, 2: 1.5, 4: 2.0, 8: 2.3}
    batch = ["lookahead"] * 8
    chosen = []
    for _ in range(300):
        share = policy.choose(batch)
        chosen.append(share)
        policy.observe(batch, share, [gain[share]] * 8, forward_tokens=8 * share,
                       seconds=0.05 + 0.001 * 8 * share)
    assert chosen[0] == 8  # it starts from the ceiling (the fixed rule) ...
    assert chosen[-100:].count(4) >= 80  # ... and settles on the best share
    assert policy.table()["gain lookahead@4"] == 2.0
    # Four requests (shares up to 16): 4 is best again (4 * 2.0 / 0.066 s beats
    # 4 * 2.3 / 0.082 s at 8), its neighbours and plain decoding explored. Alone, a request
    # gets the whole budget.
    assert {policy.choose(["lookahead"] * 4) for _ in range(100)} == {1, 2, 4, 8}
    assert policy.choose(["lookahead"]) == 64
    # Plain decoding gains nothing from a share: a batch of it takes one token each.
    assert sum(policy.choose(["autoregressive"] * 8) == 1 for _ in range(100)) >= 85


def test_budget_policy_falls_back_to_plain_decoding_when_speculation_measures_slower() -> None:
    """The cost line is fitted on 1 to 8 requests, where a step costs 50 ms + 1 ms per token,
    so it predicts that 16 requests gain from a share of 2. But 16 requests pay 4 ms each for
    their proposals, which the line cannot see: measured, one token each is faster, and the
    policy must settle there."""
    policy = BudgetPolicy(64, explore=0.1, seed=3)
    gain = {1: 1.0, 2: 1.6, 4: 2.0, 8: 2.2, 16: 2.3, 32: 2.4, 64: 2.5}
    for _ in range(200):
        for running in (1, 2, 4, 8):
            batch = ["lookahead"] * running
            share = policy.choose(batch)
            policy.observe(batch, share, [gain[share]] * running, forward_tokens=running * share,
                           seconds=0.05 + 0.001 * running * share)
    batch = ["lookahead"] * 16
    assert policy.predicted_rate(batch, 2) > 1.2 * policy.predicted_rate(batch, 1)  # the line
    chosen = []
    for _ in range(300):
        share = policy.choose(batch)
        chosen.append(share)
        seconds = 0.05 + 0.001 * 16 * share + (0.004 * 16 if share > 1 else 0.0)
        policy.observe(batch, share, [gain[share]] * 16, forward_tokens=16 * share,
                       seconds=seconds)
    assert chosen[-100:].count(1) >= 80
    # Settled: its neighbour (2) is measured too, so it explores a quarter as often -- each
    # try costs time here -- but still does: 1000 steps at explore=0.1 would try 2 about 33
    # times, a quarter as often about 8.
    tries = sum(policy.choose(batch) != 1 for _ in range(1000))
    assert 1 <= tries <= 20


def test_budget_policy_needs_a_clear_predicted_lead_to_speculate_in_a_new_batch() -> None:
    """Small batches teach the line (50 ms + 1 ms per token) and the gains. For 16 requests it
    then predicts a share of 2 (1.34 tokens each in 82 ms) 8 % faster than one token each
    (16 ms less) -- within the line's error for many requests, so the new batch starts with
    one token each; a share predicted 20 % faster is taken at once."""
    for gain_2, first in ((1.34, 1), (1.49, 2)):
        policy = BudgetPolicy(64, explore=0.1, seed=3)
        gain = {1: 1.0, 2: gain_2, 4: 1.6, 8: 1.8, 16: 1.9, 32: 2.0, 64: 2.1}
        for _ in range(100):
            for running in (1, 2, 4, 8):
                batch = ["lookahead"] * running
                share = policy.choose(batch)
                policy.observe(batch, share, [gain[share]] * running,
                               forward_tokens=running * share,
                               seconds=0.05 + 0.001 * running * share)
        batch = ["lookahead"] * 16
        lead = policy.predicted_rate(batch, 2) / policy.predicted_rate(batch, 1)
        assert lead == pytest.approx(gain_2 * 66 / 82, rel=0.02)
        policy.explore = 0.0
        assert policy.choose(batch) == first


def test_budget_policy_speculates_where_it_measures_faster_than_predicted() -> None:
    """The reverse case. Small batches (1 to 8 requests) pay 50 ms + 3 ms per token, and
    keep the cost line steep: it predicts that 16 requests do best with one token each. But a
    step of 16 requests costs 100 ms + 0.5 ms per token (its fixed work dominates): measured,
    a share of 4 commits 16 * 1.6 tokens in 132 ms against 16 in 108 ms, so the policy must
    find it by exploring and settle there, while the small batches go on."""
    policy = BudgetPolicy(64, explore=0.1, seed=5)
    gain = {1: 1.0, 2: 1.3, 4: 1.6, 8: 1.8, 16: 1.9, 32: 2.0, 64: 2.1}

    def step(running: int) -> int:
        batch = ["lookahead"] * running
        share = policy.choose(batch)
        tokens = running * share
        seconds = 0.1 + 0.0005 * tokens if running == 16 else 0.05 + 0.003 * tokens
        policy.observe(batch, share, [gain[share]] * running, forward_tokens=tokens,
                       seconds=seconds)
        return share

    chosen = []
    for _ in range(400):
        for running in (1, 2, 4, 8):
            step(running)
        chosen.append(step(16))
    batch = ["lookahead"] * 16
    assert policy.predicted_rate(batch, 1) > 1.2 * policy.predicted_rate(batch, 4)  # the line
    assert chosen[-100:].count(4) >= 80
