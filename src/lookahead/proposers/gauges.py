"""What a request's candidates and its Jacobi window are worth, measured on its own steps.

``DepthGauge`` rates each source's candidates depth by depth and cuts them where a token stops
paying for its place in the step; ``WindowGauge`` measures what the lookahead window's
n-grams add to a step and runs the window while that pays for its tokens. Both price on the
step costs (``StepClock``) where a curve is given, else on one ``token_cost`` per token.

Where priced, a source's depths start from what they were measured to be worth
(``SOURCE_PRIORS``) rather than from an even chance: a fresh request then feeds about what a
tuned one would in its first steps, before its own steps have told.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from lookahead.proposers.step_clock import StepClock

# Where priced, what each source's tokens at depths 1, 2, ... start from (past the last, the
# last): the rate at which a token there added a committed token that no candidate before it
# reached, as `DepthGauge.record` counts them (`benchmarks/source_rates.py`). Measured with
# greedy lookahead as it was before these priors (every depth at even odds), 2 threads, on
# an Intel Xeon (2026-12-06): SmolLM2-135M on task-groups-12 (128 tokens) and
# Qwen2.5-Coder-1.5B on chat-mix-11 (256 tokens), rounded between the two:
#   text      0.56-0.65, 0.40-0.46, 0.34-0.35, 0.18-0.23, 0.09-0.16, then 0.03-0.16
#   text1     0.19-0.22, 0.09-0.15, 0.05-0.08, 0.03-0.05, then 0-0.04
#   pool      0.04, 0.01, 0.00-0.01, 0.00
#   window    0.07-0.10, 0.04-0.09, 0.03-0.04, 0.03-0.04
# and a recycled chain's first token a third of the time, a branch's 3-12 %. An even chance
# for every depth (what an unmeasured source starts from) fed up to 29 tokens a step in a
# request's first steps: on answers of a few tokens that cost more than it returned
# (SmolLM2's RAG prompts decoded 0.92x autoregressive). With these priors in place the
# script gives SmolLM2's groups text 0.66, 0.34, 0.21, 0.17, 0.11, text1 0.22, 0.10, 0.03,
# pool 0.04, 0.00 (the copies fed shorter, so fewer deep samples).
SOURCE_PRIORS = MappingProxyType({
    "text": (0.6, 0.43, 0.35, 0.2, 0.12, 0.06),
    "text1": (0.2, 0.12, 0.06, 0.04, 0.02),
    "pool": (0.04, 0.01),
    "window": (0.08, 0.06, 0.03),
    "recycled": (0.3, 0.1),
    "recycled@": (0.1, 0.03),
})
# Where priced, what a running window adds to a step until measured: the window rows' sum.
WINDOW_PRIOR = 0.2


class WindowGauge:
    """Whether the window pays for its tokens, measured on one request's steps.

    Each step, the window's *gain* is how many more tokens the step's candidates would accept
    than the candidates that do not come from the window alone (the text's n-grams and the
    copy): with greedy decoding, the longest common prefix with the committed tokens. With
    ``g`` and ``s`` the moving averages of that gain and of the tokens committed per step,
    ``t`` the step's other tokens and ``b`` the window's, at ``token_cost`` ``k`` per token::

        (s + g) / (1 + k (t + b)) >= s / (1 + k t)   <=>   g (1 + k t) >= k b s

    and the window runs when that holds -- and every ``probe``-th step regardless, so that a
    window that has stopped paying can show it pays again. The first ``warm_up`` steps of a
    request run it too: its levels fill and its first n-grams get tried.

    Priced on the step costs (``pays``), the window is an investment like any candidate
    token: it runs when ``(e + g) / cost(t + b) >= e / cost(t)``, ``e`` the tokens the step is
    expected to commit without it, ``b`` its tokens once its levels are full, and ``g`` from
    ``WINDOW_PRIOR`` until measured. No warm-up and no probe: a window run once in a while
    gives stale n-grams, and where the curve is flat (a GPU) the window pays from the first
    step.
    """

    def __init__(self, token_cost: float, probe: int, warm_up: int,
                 smoothing: float = 0.1, priced: bool = False) -> None:
        self.token_cost = token_cost
        self.probe = probe
        self.warm_up = warm_up
        self.smoothing = smoothing
        # priced, the prior counts as one step recorded
        self.gain = WINDOW_PRIOR if priced else 0.0
        self.committed = 0.0
        self.steps = 0  # decisions taken
        self.recorded = 1 if priced else 0  # steps recorded

    def wants_window(self, window_tokens: int, other_tokens: int) -> bool:
        self.steps += 1
        if self.steps <= self.warm_up or self.steps % self.probe == 0:
            return True
        k = self.token_cost
        return self.gain * (1 + k * other_tokens) >= k * window_tokens * self.committed

    def pays(self, expected: float, tokens: int, window_tokens: int, clock: StepClock) -> bool:
        """Whether the window's ``window_tokens`` pay in a step of ``tokens`` tokens expected
        to commit ``expected`` without them, on ``clock``'s costs."""
        return (expected + self.gain) * clock.cost(tokens) >= (
            expected * clock.cost(tokens + window_tokens))

    def record(self, candidates: list[list[int]], from_text: list[bool],
               committed: list[int]) -> None:
        """One step: its candidates, which of them the text gave, and what it committed."""
        reach = [_common_prefix(c, committed) for c in candidates]
        gain = max(reach, default=0) - max(
            (r for r, text in zip(reach, from_text) if text), default=0
        )
        # A plain mean of the first 1 / smoothing steps, a moving average after them.
        self.recorded += 1
        weight = max(self.smoothing, 1.0 / self.recorded)
        self.gain += weight * (gain - self.gain)
        self.committed += weight * (len(committed) - self.committed)


class DepthGauge:
    """How deep each source's candidates pay for their tokens, measured on one request's steps.

    A candidate's token at depth d (the d-th after x0) adds a committed token only where the
    candidate matches the committed text up to d. With ``q`` the rate at which a source's
    candidates do, ``s`` the tokens committed per step and ``t`` the tokens a step feeds
    besides x0, at ``token_cost`` ``k`` per token, one more token pays when::

        (s + q) / (1 + k (t + 1)) >= s / (1 + k t)   <=>   q (1 + k t) >= k s

    so a candidate is cut before its first depth whose rate falls short (``k = 0``: never). A
    rate starts as one hit (every depth is tried at first; priced on step costs, at its
    source's ``SOURCE_PRIORS``), is a plain mean over its first ``1 / smoothing`` steps and a
    moving average after them. It learns from the full candidate,
    deeper than what was fed where the text tells: a copy cut after 4 tokens whose 5th matches
    the 5th committed token scores at depth 5 too, so a cut depth can come back.
    """

    def __init__(self, token_cost: float, smoothing: float = 0.1,
                 step_costs: tuple[float, ...] | None = None) -> None:
        self.token_cost = token_cost
        self.smoothing = smoothing
        # the costs as this request's passes measure them, from the tuned ones (None: unpriced)
        self.clock = None if step_costs is None else StepClock(step_costs, token_cost)
        # A depth not yet seen counts as one hit (every depth is tried at first); priced on
        # the step costs, as what it was measured to be worth (SOURCE_PRIORS), or an even
        # chance for a source not measured.
        self.prior = 1.0 if step_costs is None else 0.5
        self.priors = {} if step_costs is None else SOURCE_PRIORS
        self._rates: dict[str, list[list[float]]] = {}  # source -> [rate, samples] per depth
        self.committed = 1.0
        self.fed = 0.0

    def prior_of(self, source: str, depth: int = 0) -> float:
        """The rate a ``source`` candidate's token at index ``depth`` (0: the first after x0)
        starts from (a recycled branch's by its kind: ``recycled@2.1`` is a ``recycled@``
        one)."""
        priors = self.priors.get(source_kind(source))
        if priors is None:
            return self.prior
        return priors[min(depth, len(priors) - 1)]

    def depth(self, source: str, length: int) -> int:
        """How many of the first ``length`` tokens of a ``source`` candidate to feed."""
        k = self.token_cost
        bar = k * self.committed / (1 + k * self.fed)
        rates = self._rates.get(source, ())
        for d, (rate, _) in enumerate(rates[:length]):
            if rate < bar:
                return d
        return length

    def priced_depths(self, proposed: list[tuple[list[int], str]]) -> list[int]:
        """How many tokens of each ``(candidate, source)`` to feed, priced on ``step_costs``
        as this request's passes have measured them since (``StepClock``).

        Candidates are taken in order, each token while the step's expected committed tokens
        (1 + the rates of the tokens in so far) grow faster than its cost:
        ``(e + q) / cost(t + 1) > e / cost(t)`` for a token at rate ``q`` that would make the
        step ``t + 1`` tokens long. A prefix already in (the trie shares it) comes free.
        """
        return self.priced(proposed)[0]

    def priced(self, proposed: list[tuple[list[int], str]]) -> tuple[list[int], float]:
        """``(depths, expected)``: ``priced_depths`` and the tokens the step is expected to
        commit with them."""
        expected, tokens, depths = 1.0, 1, []
        fed: set[tuple[int, ...]] = set()
        for candidate, source in proposed:
            rates = self._rates.get(source, ())
            depth = 0
            while depth < len(candidate):
                prefix = tuple(candidate[: depth + 1])
                if prefix not in fed:
                    rate = (rates[depth][0] if depth < len(rates)
                            else self.prior_of(source, depth))
                    if (expected + rate) * self.clock.cost(tokens) <= (
                            expected * self.clock.cost(tokens + 1)):
                        break
                    expected, tokens = expected + rate, tokens + 1
                    fed.add(prefix)
                depth += 1
            depths.append(depth)
        return depths, expected

    def record(self, proposed: list[tuple[list[int], str]], fed: int,
               committed: list[int]) -> None:
        """One step: its full candidates with their sources, the tokens it fed besides x0 and
        what it committed.

        Priced on ``step_costs``, a token counts as a hit only where no candidate before it
        reached as deep: the rates then add up to the tokens the step commits (the longest
        reach), so a second candidate that mostly agrees with the first earns little."""
        before = 0  # how deep the candidates so far reached
        for candidate, source in proposed:
            rates = self._rates.setdefault(source, [])
            reach = _common_prefix(candidate, committed)
            # Past a mismatch every depth missed; past a match as long as the committed text,
            # the text does not tell yet.
            known = len(candidate) if reach < len(committed) else reach
            while len(rates) < known:
                rates.append([self.prior_of(source, len(rates)), 1])
            first = before if self.clock is not None else 0
            for d in range(known):
                entry = rates[d]
                entry[1] += 1
                hit = float(first <= d < reach)
                entry[0] += max(self.smoothing, 1.0 / entry[1]) * (hit - entry[0])
            before = max(before, reach)
        self.committed += self.smoothing * (len(committed) - self.committed)
        self.fed += self.smoothing * (fed - self.fed)


def source_kind(source: str) -> str:
    """The kind a source's rates start from in ``SOURCE_PRIORS``: a recycled branch
    (``recycled@2.1``) is a ``recycled@`` one; other sources are their own kind."""
    return source.partition("@")[0] + ("@" if "@" in source else "")


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
