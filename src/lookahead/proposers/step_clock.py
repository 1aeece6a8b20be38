"""What a step of k tokens costs here and now, relative to a step of one, for pricing candidates.

``lookahead tune`` measures the forward-cost curve once (``LookaheadConfig.step_costs``), but
on a shared CPU the curve itself moves. Timed inside HumanEval decoding of Qwen2.5-Coder-1.5B
Q4_K_M (2026-11-27, AMD EPYC Zen 4, 2 threads): while the memory was busy, a one-token pass
took 35 ms and one of 4 tokens 37 ms (1.06x); while it was not, 28 and 38 ms (1.36x), as
the linear layers turn from waiting on memory to waiting on arithmetic. Candidates cut on
the wrong curve feed too few tokens or too many.

``StepClock`` starts from the tuned curve and, as the request's own passes are timed, moves
each size to what it measured: a moving average of the seconds of each size, taken once a
size has ``warm_up`` samples, relative to size one. For the ``explore`` sizes past the
largest measured, each token adds the measured sizes' mean step (the only way to learn that
larger steps have become cheap is to try one); between measured sizes and beyond those, the
tuned curve's step ratio. The costs never decrease with the size.

Why not the mean step all the way: the curve is flat while the passes wait on memory and
steep once they wait on arithmetic, so the slope of steps of 1-4 tokens, carried to 50,
priced a 50-token step at under 2x one. Qwen2.5-Coder-1.5B Q4_K_M on an Intel Xeon (model
167, 2 threads, 2026-12-07) then fed steps of 9 to 50 tokens on a chat prompt, committing
23 tokens in 18 of them, where its load-time curve put 16 tokens at 2.3x one. Exploring a
size or two at a time, the measured part still grows as far as steps stay cheap.
"""

from __future__ import annotations


class StepClock:
    """Relative step costs (``cost(1) == 1``), from ``tuned`` until measured.

    tuned: the tuned curve, what steps of 1, 2, ... tokens cost relative to one
        (``LookaheadConfig.step_costs``); past its end each token costs what its last did
        (``token_cost`` for a curve of one size).
    explore: how many sizes past the largest measured one are priced at the measured sizes'
        mean step rather than at the tuned curve's ratio.
    """

    def __init__(self, tuned: tuple[float, ...], token_cost: float, smoothing: float = 0.1,
                 warm_up: int = 3, sizes: int = 32, explore: int = 2) -> None:
        self.tuned = tuned
        self.token_cost = token_cost
        self.smoothing = smoothing
        self.warm_up = warm_up
        self.explore = explore
        self._seconds: dict[int, list[float]] = {}  # size -> [moving mean, samples]
        self._costs = [self._tuned(k) for k in range(1, sizes + 1)]

    def cost(self, tokens: int) -> float:
        """What a step of ``tokens`` tokens costs relative to one."""
        costs = self._costs
        if tokens <= len(costs):
            return costs[tokens - 1]
        return costs[-1] + (costs[-1] - costs[-2]) * (tokens - len(costs))

    def record(self, tokens: int, seconds: float) -> None:
        """A forward pass of ``tokens`` tokens took ``seconds``."""
        if tokens < 1 or not seconds > 0:
            return
        entry = self._seconds.setdefault(tokens, [seconds, 0])
        entry[1] += 1
        entry[0] += max(self.smoothing, 1.0 / entry[1]) * (seconds - entry[0])
        if entry[1] >= self.warm_up:
            self._costs = self._measured()

    def _measured(self) -> list[float]:
        """The costs of every size, each measured one in place of the tuned curve's."""
        seen = {k: mean for k, (mean, count) in self._seconds.items() if count >= self.warm_up}
        if 1 not in seen:
            return self._costs
        top = max(seen)
        slope = (seen[top] / seen[1] - 1) / (top - 1) if top > 1 else None
        costs, previous = [], 1.0
        for k in range(1, len(self._costs) + 1):
            if k in seen:
                cost = seen[k] / seen[1]
            elif top < k <= top + self.explore and slope is not None:
                cost = previous + slope  # the measured sizes' mean step, to try them
            else:  # the tuned step from the size before
                cost = previous * self._tuned(k) / self._tuned(k - 1)
            previous = max(cost, previous)
            costs.append(previous)
        return costs

    def _tuned(self, tokens: int) -> float:
        """The tuned curve at ``tokens``, extended past its end."""
        curve = self.tuned
        if tokens <= len(curve):
            return curve[tokens - 1]
        last = curve[-1] - curve[-2] if len(curve) > 1 else self.token_cost
        return curve[-1] + last * (tokens - len(curve))
