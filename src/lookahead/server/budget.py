"""How many input tokens each request's step gets: speculation that adapts to load.

A forward pass of a few tokens costs about as much as one, but not of many: on the 2-core CPU
this was written on, SmolLM2-135M's forward over 8 requests took ~66 ms at 1 token each,
~91 ms at 4 and ~134 ms at 8 -- while a request accepts fewer extra tokens per extra proposed
token the more it is given. The best share per request depends on the model, the machine,
the method, the text and how many requests share the pass, so it is measured.

The ceiling is the fixed rule: with n running requests each gets at most
``max(1, step_token_budget // n)`` tokens (alone, all of the budget; with many, one token --
plain batched decoding). Below the ceiling the policy picks a share k from the ladder
1, 2, 4, 8, ... that maximises the predicted committed tokens per second::

    sum over the running requests r of gain(method of r, k) / cost(n * k)

* ``gain(m, k)``: tokens a request of method m commits per step when given k tokens (1 for
  k = 1 and for plain decoding), a moving average over the steps run at k. It describes the
  proposals, not the machine, so a load spike on a shared machine does not distort it.
* ``cost(N)``: seconds of a step that feeds N tokens (padding included), a straight line
  ``a + b * N`` fitted by least squares over recent steps (older ones fade out). A share is
  not always filled (the proposals may be shorter), so N is ``n`` times the tokens a request
  actually fed per step at that share, on average.

A predicted share above 1 must beat one token each by a margin (15 %), as the line is
optimistic for many requests.

A request alone always gets the ceiling. Until both are known (a few steps at a few sizes)
the ceiling is used too. The model can be wrong where costs it does not see grow with the
batch (per-request work, padding, cache columns), and its gains are averages over requests
and batch sizes, so it only decides until what happened is known: the committed tokens per
second and request of the steps actually run, per batch (its size and methods) and share.
Once a share has run a few times in such a batch, its measured rate replaces the prediction,
in both directions: a share can measure slower than plain decoding, or faster than predicted.
Rates are kept per exact batch size because they fall as the batch grows: averaged over
sizes, a share tried mostly in larger batches would look worse than one tried in smaller
ones. A fraction ``explore`` of the steps tries a share one rung above or below the best, or
one token each, so that untried shares get measured and the choice follows the load; once
those have measured rates in the batch, a quarter as many.

Example: ``policy.choose(["lookahead"] * 8)`` -> 4; after the step, ``policy.observe(
["lookahead"] * 8, 4, committed=[3, 1, 2, 4, 1, 5, 2, 3], forward_tokens=32, seconds=0.09)``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

# Methods whose steps never hold proposals: a request of theirs commits one token per step.
NON_SPECULATIVE = frozenset({"autoregressive"})

_MIN_COST_POINTS = 8  # steps before the cost line is trusted
_MIN_RATE_STEPS = 3  # steps at a (batch size, share) before its measured rate decides
_MIN_SPREAD = 2.0  # ... and the largest step must be this many times the smallest
# The cost line is fitted mostly on small batches with large shares, and misses per-row work
# (attention over each row's cache, the cache's append): for many requests it is optimistic.
# At 16 requests on SmolLM2 it predicted a share of 2 5 % faster than one token each, which
# measured 8 % slower -- and a wave of requests meets a new batch size every few steps, before
# its rates are measured. So a share above 1 that is only predicted must lead by this much.
_PREDICTION_MARGIN = 0.15
# Once the shares that exploring would try all have measured rates in a batch, exploring
# costs more than it teaches: at 16 requests on SmolLM2 a share of 2 measured ~8 % slower than
# one token each, so each exploring step there was lost time. Explore this fraction as often.
_SETTLED_EXPLORE = 0.25


def _batch_key(methods: Sequence[str]) -> tuple[str, ...]:
    """Measured rates are kept per batch: its size, and how many requests use each method."""
    return tuple(sorted(methods))


@dataclass
class _Average:
    value: float = 0.0
    count: int = 0

    def add(self, x: float, smoothing: float) -> None:
        """A plain mean of the first 1 / smoothing values, a moving average after them."""
        self.count += 1
        self.value += max(smoothing, 1.0 / self.count) * (x - self.value)


@dataclass
class BudgetPolicy:
    """Per-request step budget; ``adaptive=False`` always gives the ceiling.

    step_token_budget: the most input tokens of one forward pass, shared by the requests.
    explore: fraction of steps that try a neighbouring share.
    smoothing: weight of a new step in the gain averages.
    forgetting: per-step decay of older steps in the cost fit (1 = never forget).
    """

    step_token_budget: int = 64
    adaptive: bool = True
    explore: float = 0.1
    smoothing: float = 0.05
    forgetting: float = 0.98
    seed: int = 0
    _gain: dict[tuple[str, int], _Average] = field(default_factory=dict, repr=False)
    _rate: dict[tuple[tuple[str, ...], int], _Average] = field(default_factory=dict, repr=False)
    _width: dict[int, _Average] = field(default_factory=dict, repr=False)
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5, repr=False)
    _points: int = field(default=0, repr=False)
    _sizes: tuple[float, float] = field(default=(float("inf"), 0.0), repr=False)
    _random: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def ceiling(self, running: int) -> int:
        return max(1, self.step_token_budget // max(1, running))

    def levels(self, running: int) -> list[int]:
        """1, 2, 4, ... up to the ceiling (which is always the last level)."""
        top, levels, level = self.ceiling(running), [], 1
        while level < top:
            levels.append(level)
            level *= 2
        return levels + [top]

    def choose(self, methods: Sequence[str]) -> int:
        """The share of each of the running requests (``methods``: each one's method)."""
        levels = self.levels(len(methods))
        if not self.adaptive or len(levels) == 1 or len(methods) == 1:
            # Alone, a request decodes exactly as ``lookahead.generate`` would: the whole
            # budget is its own, and a proposer with state (the lookahead window) only pays
            # off when its share holds from step to step, which single trial steps cannot show.
            return levels[-1]
        key = _batch_key(methods)
        scores = {k: s for k in levels if (s := self._score(methods, key, k)) is not None}
        best = len(levels) - 1  # until two shares can be compared: the fixed rule
        if len(scores) >= 2:
            best = levels.index(max(scores, key=scores.get))
        # A neighbouring share, or plain decoding: the rate that any share must beat.
        tries = [levels[min(max(i, 0), len(levels) - 1)] for i in (best - 1, best + 1, 0)]
        explore = self.explore
        if all(self._measured(key, k) for k in tries):
            explore *= _SETTLED_EXPLORE  # all known here: keep them fresh, cheaply
        if self._random.random() < explore:
            return self._random.choice(tries)
        return levels[best]

    def predicted_rate(self, methods: Sequence[str], share: int) -> float | None:
        """Committed tokens per second of these requests at ``share``, or None if unknown."""
        width = self._width[share].value if share in self._width else share
        cost = self._cost(round(len(methods) * width))
        if cost is None:
            return None
        gains = [self._gain_of(method, share) for method in methods]
        if any(g is None for g in gains):
            return None
        return sum(gains) / cost

    def _score(self, methods: Sequence[str], key: tuple[str, ...], share: int) -> float | None:
        """Committed tokens per second and request at ``share``: as measured in this batch
        once it ran there a few times, else as predicted (None if neither is known).
        ``key``: the batch's ``_batch_key``, computed once per choice."""
        if self._measured(key, share):
            return self._rate[key, share].value
        predicted = self.predicted_rate(methods, share)
        if predicted is None:
            return None
        # Predicted speculation must lead by a margin: the line errs in its favour.
        return predicted / len(methods) / (1.0 + _PREDICTION_MARGIN if share > 1 else 1.0)

    def _measured(self, key: tuple[str, ...], share: int) -> bool:
        rate = self._rate.get((key, share))
        return rate is not None and rate.count >= _MIN_RATE_STEPS

    def _gain_of(self, method: str, share: int) -> float | None:
        if share == 1 or method in NON_SPECULATIVE:
            return 1.0
        average = self._gain.get((method, share))
        return average.value if average is not None else None

    def observe(self, methods: Sequence[str], share: int, committed: Sequence[int],
                forward_tokens: int, seconds: float) -> None:
        """Record a step: requests of ``methods`` at ``share`` committed ``committed[i]``
        tokens each in ``seconds``, feeding ``forward_tokens`` tokens (padding included)."""
        if not self.adaptive or seconds <= 0 or not methods:
            return
        if share > 1:
            for method, count in zip(methods, committed):
                if method not in NON_SPECULATIVE:
                    self._gain.setdefault((method, share), _Average()).add(count, self.smoothing)
        rate = self._rate.setdefault((_batch_key(methods), share), _Average())
        rate.add(sum(committed) / seconds / len(methods), self.smoothing)
        width = forward_tokens / len(methods)
        self._width.setdefault(share, _Average()).add(width, self.smoothing)
        decay, x = self.forgetting, float(forward_tokens)
        for i, term in enumerate((1.0, x, x * x, seconds, x * seconds)):
            self._sums[i] = decay * self._sums[i] + term
        self._points += 1
        self._sizes = (min(self._sizes[0], x), max(self._sizes[1], x))

    def _cost(self, forward_tokens: int) -> float | None:
        """Least-squares line through (tokens, seconds) of recent steps, at ``forward_tokens``."""
        low, high = self._sizes
        if self._points < _MIN_COST_POINTS or high < _MIN_SPREAD * low:
            return None
        n, sx, sxx, sy, sxy = self._sums
        det = n * sxx - sx * sx
        if det <= 0:
            return None
        slope = max((n * sxy - sx * sy) / det, 0.0)
        intercept = (sy - slope * sx) / n
        cost = intercept + slope * forward_tokens
        return cost if cost > 0 else None

    def forget(self) -> None:
        """Drop what was learnt (e.g. the slow first steps of a warm-up)."""
        self._gain.clear()
        self._rate.clear()
        self._width.clear()
        self._sums = [0.0] * 5
        self._points = 0
        self._sizes = (float("inf"), 0.0)

    def table(self) -> dict[str, float]:
        """What was learnt, for logs and /health: gain per share, and the cost line."""
        table = {f"gain {m}@{k}": round(a.value, 3) for (m, k), a in sorted(self._gain.items())}
        for size in (1, 8, 64):
            cost = self._cost(size)
            if cost is not None:
                table[f"ms@{size}"] = round(cost * 1e3, 1)
        return table
