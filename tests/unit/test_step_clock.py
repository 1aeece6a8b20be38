"""``StepClock``: relative step costs, from the tuned curve until the request measures them."""

from __future__ import annotations

import pytest

from lookahead.config import LookaheadConfig
from lookahead.proposers.base import StepOutcome
from lookahead.proposers.lookahead import LookaheadProposer
from lookahead.proposers.step_clock import StepClock

# The clock moved by the passes, as in use (not the tests' steady one: conftest.py).
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.timed_step_costs]


def test_the_tuned_curve_holds_until_a_size_is_measured_often_enough():
    clock = StepClock((1.0, 1.1, 1.3), token_cost=0.2, warm_up=3)
    assert [clock.cost(k) for k in (1, 2, 3, 4, 5)] == pytest.approx([1.0, 1.1, 1.3, 1.5, 1.7])
    for _ in range(2):  # size 1 and 2 twice: not yet enough
        clock.record(1, 0.030)
        clock.record(2, 0.030)
    assert clock.cost(2) == pytest.approx(1.1)
    clock.record(1, 0.030)
    clock.record(2, 0.030)  # now measured: the busy machine's flat curve
    assert clock.cost(2) == pytest.approx(1.0)
    # Past the sizes measured, each token adds their mean step: nothing here.
    assert clock.cost(3) == clock.cost(4) == pytest.approx(1.0)
    for _ in range(3):
        clock.record(4, 0.036)  # a gap at 3: the tuned step from size 2, 1.3 / 1.1
    assert clock.cost(3) == pytest.approx(1.3 / 1.1) and clock.cost(4) == pytest.approx(1.2)
    assert clock.cost(6) == pytest.approx(1.2 + 2 * 0.2 / 3)
    # Two sizes past the largest measured at the mean step, then the tuned curve's ratios
    # (extended by its last step, 0.2): a flat start is not carried to large steps.
    tuned = {6: 1.9, 7: 2.1, 10: 2.7}
    assert clock.cost(7) == pytest.approx(clock.cost(6) * tuned[7] / tuned[6])
    assert clock.cost(10) == pytest.approx(clock.cost(6) * tuned[10] / tuned[6])


def test_a_flat_start_does_not_make_large_steps_cheap():
    """Steps of 1-4 tokens measured flat; a step of 12 still costs what the tuned curve's
    ratios say past the explored sizes, not 12 tokens at the flat start's slope."""
    tuned = (1.0, 1.04, 1.07, 1.16, 1.25, 1.35, 1.46, 1.57, 1.75, 2.0, 2.2, 2.3)
    clock = StepClock(tuned, token_cost=0.1, warm_up=1, explore=2)
    for size, seconds in ((1, 0.060), (2, 0.0606), (3, 0.0612), (4, 0.0618)):
        clock.record(size, seconds)
    assert clock.cost(6) == pytest.approx(1.03 + 2 * 0.01)
    assert clock.cost(12) == pytest.approx(1.05 * 2.3 / 1.35)
    wide = StepClock(tuned, token_cost=0.1, warm_up=1, explore=32)  # the mean step throughout
    for size, seconds in ((1, 0.060), (2, 0.0606), (3, 0.0612), (4, 0.0618)):
        wide.record(size, seconds)
    assert wide.cost(12) == pytest.approx(1.11)


def test_measured_costs_never_decrease_and_follow_a_moving_mean():
    clock = StepClock((1.0, 1.5), token_cost=0.5, warm_up=1, smoothing=0.5)
    clock.record(1, 0.020)
    clock.record(2, 0.018)  # noise: a pass of 2 cannot cost less than one of 1
    assert clock.cost(2) == 1.0 and clock.cost(3) == 1.0
    clock.record(2, 0.030)  # mean of the first two: 0.024
    assert clock.cost(2) == pytest.approx(1.2) and clock.cost(3) == pytest.approx(1.4)
    clock.record(2, 0.040)  # then a moving mean, weight 0.5: 0.032
    assert clock.cost(2) == pytest.approx(1.6)
    clock.record(3, 0.0)  # nonsense is ignored
    clock.record(0, 0.05)
    assert clock.cost(3) == pytest.approx(2.2)


def test_the_proposer_feeds_more_once_its_passes_show_tokens_are_cheap():
    """Priced on a steep tuned curve, a copy whose third token is right half the time is
    cut after two; once the request's own passes show that steps of 2 and 3 tokens cost
    what one does, it goes in whole."""
    text = [5, 6, 7, 1, 2, 3, 4, 8, 5, 6, 7]
    config = LookaheadConfig(window=1, ngram=2, guess=1, lookup_tokens=3, token_cost=1.0,
                             prompt_pool=False, output_pool=False, window_probe=1 << 20,
                             step_costs=(1.0, 1.3, 1.8, 2.4))
    proposer = LookaheadProposer(config)
    proposer.start(text)
    proposer.gauge.warm_up = 0  # no window
    fed = []
    for step in range(12):
        proposal = proposer.propose(text, max_tokens=3)
        fed.append(sum(map(len, proposal.candidates)))
        committed = [1, 2, 3, 4] if step % 2 else [1, 2, 9]  # the third right every other
        size = 1 + fed[-1]
        proposer.update(text, StepOutcome(committed, min(len(committed) - 1, fed[-1]), None,
                                          forward_tokens=size, seconds=0.03))
        if step < 3:  # plain passes too, as steps without candidates give
            proposer.update(text, StepOutcome([1, 9], 0, None, forward_tokens=1, seconds=0.03))
    # At a copy's measured priors (0.6, 0.43) 1.6 / 1.3 > 1 but 2.03 / 1.8 < 1.6 / 1.3: one
    # token; then the rates and the measured costs take it to all three.
    assert fed[0] == 1 and fed[-1] == 3, fed
    untimed = LookaheadProposer(config)  # the same steps, never timed: cut after two
    untimed.start(text)
    untimed.gauge.warm_up = 0
    for step in range(12):
        proposal = untimed.propose(text, max_tokens=3)
        untimed.update(text, StepOutcome([1, 2, 3, 4] if step % 2 else [1, 2, 9], 2, None))
    assert sum(map(len, proposal.candidates)) == 2
