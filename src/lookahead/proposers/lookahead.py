"""Lookahead decoding (Fu et al., ICML 2024): a Jacobi window that feeds an n-gram pool.

The window keeps ``L = N - 1`` levels of W guesses each; level ``l``, column ``j`` stands at
``l + j + 1`` positions after ``x0``. Read along a column, the levels are consecutive
positions, so ``(level_0[j], ..., level_{L-1}[j], out[j])`` -- where ``out[j]`` is the model's
next-token guess at the top level -- is an n-gram of length N that the model itself produced.
Those n-grams go into the pool; candidates for the next step are the pool's n-grams starting
with ``x0``. After each step the window slides by one level: the lowest level drops out and the
top level's outputs become the new top level (one Jacobi iteration).

Attention inside the window (``Branch.visible``): level 0 is causal along its W columns; a
token at level ``l >= 1``, column ``j`` sees level 0 up to column ``j`` and levels ``1..l`` of
column ``j`` -- exactly the tokens at the positions before it.

The window costs W x (N - 1) tokens in every step it runs, and where more tokens in a forward
pass are not free (a CPU) it must earn them: ``WindowGauge`` measures what the window's own
n-grams add to each step, and the window runs only while that pays for its tokens.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

import torch

from lookahead.attention import Branch
from lookahead.config import LookaheadConfig
from lookahead.sources.datastore import Datastore
from lookahead.sources.memory import TextMemory
from lookahead.proposers.base import Proposal, ProposerInputs, StepOutcome
from lookahead.proposers.gauges import DepthGauge, WindowGauge
from lookahead.proposers.prompt_lookup import CopyLength, find_continuation, longest_match
from lookahead.proposers.recycling import SuccessorTable
from lookahead.verify import argmax


# How many successors the recycled tree takes at depths 1, 2, 3 (then the top one only).
RECYCLE_BRANCHES = (4, 2, 2)


class NGramPool:
    """Continuations keyed by their first token: ``pool.get(t)`` gives the (n - 1)-token tails
    of the n-grams that start with ``t``, most recently seen first, at most ``capacity``.

    Example: n=3; after ``add_all([1, 2, 3, 1, 2, 4])`` ``get(1)`` is ``[[2, 4], [2, 3]]``.
    """

    def __init__(self, n: int, capacity: int) -> None:
        self.n = n
        self.capacity = capacity
        # tail -> True while the n-gram is only the window's guess (not seen in the text)
        self._tails: dict[int, OrderedDict[tuple[int, ...], bool]] = {}

    def add(self, ngram: Sequence[int], guessed: bool = False) -> None:
        """Insert one n-gram (or refresh it as most recent); evict the oldest beyond capacity.
        ``guessed``: it comes from the window, not from the text."""
        tails = self._tails.setdefault(ngram[0], OrderedDict())
        tail = tuple(ngram[1:])
        if tail in tails:
            tails[tail] = tails[tail] and guessed
            tails.move_to_end(tail)
            return
        tails[tail] = guessed
        if len(tails) > self.capacity:
            tails.popitem(last=False)

    def add_all(self, tokens: Sequence[int], start: int = 0) -> None:
        """Add every n-gram of ``tokens`` that begins at index ``start`` or later."""
        for i in range(max(start, 0), len(tokens) - self.n + 1):
            self.add(tokens[i : i + self.n])

    def get(self, token: int) -> list[list[int]]:
        return [tail for tail, _ in self.entries(token)]

    def entries(self, token: int) -> list[tuple[list[int], bool]]:
        """``get(token)``'s tails, each with whether it is only the window's guess."""
        tails = self._tails.get(token)
        return [(list(t), guessed) for t, guessed in reversed(tails.items())] if tails else []

    def __len__(self) -> int:
        return sum(len(t) for t in self._tails.values())


def window_visibility(levels: int, window: int) -> torch.Tensor:
    """Bool [levels * window, levels * window]; row/column index is ``level * window + col``."""
    size = levels * window
    vis = torch.zeros(size, size, dtype=torch.bool)
    causal = torch.tril(torch.ones(window, window, dtype=torch.bool))
    for level in range(levels):
        rows = slice(level * window, (level + 1) * window)
        vis[rows, :window] = causal  # level 0 up to this column
        for lower in range(1, level + 1):  # the same column at levels 1..level
            cols = torch.arange(window) + lower * window
            vis[torch.arange(window) + level * window, cols] = True
    return vis


class LookaheadProposer:
    """Per-request lookahead state: the Jacobi window and the n-gram pool.

    ``memory``: earlier requests' texts, copied from when this text has no match (shared, not
    per request; see ``lookahead.sources.memory``); ``datastore``: a corpus copied from when neither
    has one (see ``lookahead.sources.datastore``).
    """

    def __init__(
        self, config: LookaheadConfig, seed: int = 0, memory: TextMemory | None = None,
        datastore: Datastore | None = None, successors: SuccessorTable | None = None,
    ) -> None:
        self.config = config
        self.memory = memory
        self.datastore = datastore
        self._random = random.Random(seed)
        self.pool = NGramPool(config.ngram, config.guess)
        self.levels: list[list[int]] = []
        self._pooled = 0  # tokens of the text whose n-grams are in the pool
        self.copy_length = CopyLength(config.lookup_tokens, config.lookup_max_tokens)
        self._copied: list[int] = []  # this step's copied continuation
        self._proposed: list[tuple[list[int], str]] = []  # this step's (candidate, source), uncut
        self._fed = 0  # tokens this step fed besides x0
        self._expected = 1.0  # tokens this step's candidates are expected to commit (priced)
        self._judged = False
        self._window_full = False  # the last step ran the window with its levels full
        self.gauge = self._new_gauge()
        self.depths = self._new_depths()
        self._visibility: dict[int, torch.Tensor] = {}
        # A shared table is the model's across requests; without one, the request's own.
        self._shared_successors = successors is not None
        if not config.recycle:
            successors = None
        elif successors is None:
            successors = SuccessorTable(config.recycle)
        self.successors = successors

    @classmethod
    def build(cls, config: LookaheadConfig, inputs: ProposerInputs) -> LookaheadProposer:
        """The proposer of ``method="lookahead"`` (``MethodSpec.proposer``)."""
        return cls(config, memory=inputs.memory, datastore=inputs.datastore,
                   successors=inputs.successors)

    def start(self, prompt: list[int]) -> None:
        cfg = self.config
        self.pool = NGramPool(cfg.ngram, cfg.guess)
        if cfg.prompt_pool:
            self.pool.add_all(prompt)
        self._pooled = len(prompt)
        self.copy_length.reset()
        if self.config.recycle and not self._shared_successors:
            self.successors = SuccessorTable(self.config.recycle)
        self.gauge = self._new_gauge()
        self.depths = self._new_depths()
        self._window_full = False
        # The first level is seeded with prompt tokens; the rest fill in over N - 2 steps.
        self.levels = [[self._random.choice(prompt) for _ in range(cfg.window)]]

    def _new_gauge(self) -> WindowGauge:
        # Unpriced: the levels fill in N - 2 steps; then N steps try the window's first
        # n-grams. Priced: the window runs when it pays, from the first step.
        cfg = self.config
        return WindowGauge(cfg.token_cost, cfg.window_probe, warm_up=2 * cfg.levels,
                           priced=cfg.step_costs is not None)

    def _new_depths(self) -> DepthGauge:
        return DepthGauge(self.config.token_cost, step_costs=self.config.step_costs)

    def propose(self, context: list[int], max_tokens: int) -> Proposal:
        self._copied, self._proposed = [], []
        self._judged = max_tokens > 0  # a step of x0 alone tells nothing of the window
        if max_tokens <= 0:
            # The step feeds x0 alone (a busy server's share of one token) or is the text's
            # last: the window is of no use either. Proposing nothing, at no cost, lets a
            # request of ours decode as cheaply as a plain one when the server is busy.
            return Proposal()
        proposed = [(tail[:max_tokens], "window" if guessed else "pool")
                    for tail, guessed in self.pool.entries(context[-1])]
        copied, source = self._copy(context, min(self.copy_length.value, max_tokens))
        if copied:
            proposed.insert(0, (copied, source))
        if self.successors is not None:
            depth = min(self.config.recycle_depth, max_tokens)
            before = context[-2] if len(context) > 1 else None
            proposed += self.successors.chains(context[-1], depth, RECYCLE_BRANCHES, before)
        self._proposed = proposed
        fed = self._cut(proposed)
        self._copied = fed[0] if copied else []
        candidates = [tokens for tokens in fed if tokens]
        self._fed = sum(map(len, candidates))
        branch = None
        if self._window_pays():
            branch = self._branch()
            self._fed += len(branch.tokens)
        return Proposal(candidates, branch=branch)

    def _window_pays(self) -> bool:
        """Whether the window runs this step: priced on the step costs, on what it costs once
        its levels are full (it pays only then); else on the token cost."""
        cfg = self.config
        if self.depths.clock is None:
            return self.gauge.wants_window(cfg.window * len(self.levels), 1 + self._fed)
        return self.gauge.pays(self._expected, 1 + self._fed, cfg.window * cfg.levels,
                               self.depths.clock)

    def _cut(self, proposed: list[tuple[list[int], str]]) -> list[list[int]]:
        """Each ``(tokens, source)`` cut to the depth that pays for it (whole with
        trim_candidates off): priced on the step costs where given, else per source on the
        token cost."""
        if not self.config.trim_candidates:
            return [tokens for tokens, _ in proposed]
        if self.config.step_costs is not None:
            depths, self._expected = self.depths.priced(proposed)
        else:
            depths = [self.depths.depth(source, len(tokens)) for tokens, source in proposed]
        return [tokens[:depth] for (tokens, _), depth in zip(proposed, depths)]

    def _copy(self, context: list[int], length: int) -> tuple[list[int], str]:
        """Up to ``length`` tokens that followed the text's last tokens earlier, where at least
        two matched, else in the memory, else in the datastore, with where they come from
        ("text", "memory", "datastore"); ([], "") when lookup is off or nothing matches.

        Unpriced, the text's match is the first earlier occurrence of its last n-gram (n =
        ``lookup_ngram`` down to 2, ``find_continuation``). Priced on step costs, it is the
        latest of the longest (``longest_match``), and where no two tokens match, the copy
        after the last token alone ("text1") is tried too: the costs keep it short where it
        is rarely right.
        """
        cfg = self.config
        if cfg.lookup_ngram < 2:
            return [], ""
        last_token_only: list[int] = []  # the copy where only the last token matched
        if cfg.step_costs is None:
            match = find_continuation(context, cfg.lookup_ngram, 2, length)
        else:
            match, matched = longest_match(context, cfg.lookup_ngram, length)
            if matched < 2:
                match, last_token_only = [], match
        if match:
            return match, "text"
        for source, store in (("memory", self.memory), ("datastore", self.datastore)):
            found = store.find(context, length) if store is not None else []
            if found:
                return found, source
        return (last_token_only, "text1") if last_token_only else ([], "")

    def update(self, context: list[int], outcome: StepOutcome) -> None:
        if self.successors is not None and outcome.tree_scores is not None:
            root_at = len(context) - len(outcome.committed) - 1  # x0's index in the text
            self.successors.record_tree(outcome.tree, outcome.tree_scores,
                                        context[root_at - 1] if root_at > 0 else None)
        full = len(self.levels) == self.config.levels
        if outcome.branch_logits is not None:  # None when a busy server left the window out
            if self.successors is not None:
                self.successors.record(self.levels[-1], outcome.branch_logits)
            self._slide(argmax(outcome.branch_logits).tolist())
        if self.config.output_pool:
            self.pool.add_all(context, start=self._pooled - self.config.ngram + 1)
        self._pooled = len(context)
        self.copy_length.judge(self._copied, outcome.committed)
        # Priced, the window's gain is measured only where it is running: the n-grams it
        # gave last step are then in this step's candidates.
        if self._judged:
            if self._window_full or self.depths.clock is None:
                self.gauge.record([tokens for tokens, _ in self._proposed],
                                  [source != "window" for _, source in self._proposed],
                                  outcome.committed)
            self.depths.record(self._proposed, self._fed, outcome.committed)
        self._window_full = full and outcome.branch_logits is not None
        if self.depths.clock is not None and outcome.seconds is not None:
            self.depths.clock.record(outcome.forward_tokens, outcome.seconds)

    def _slide(self, guesses: list[int]) -> None:
        """Harvest the window's n-grams and make ``guesses`` (top level's outputs) its new top."""
        if len(self.levels) == self.config.levels:
            for column, last in enumerate(guesses):
                self.pool.add([level[column] for level in self.levels] + [last], guessed=True)
            self.levels = self.levels[1:]
        self.levels.append(guesses)

    def _branch(self) -> Branch:
        """The window as extra step tokens: level-major order, depth ``level + col + 1``."""
        n_levels, window = len(self.levels), self.config.window
        if n_levels not in self._visibility:
            self._visibility[n_levels] = window_visibility(n_levels, window)
        depths = torch.arange(window).repeat(n_levels) + 1
        depths += torch.arange(n_levels).repeat_interleave(window)
        top = torch.arange(window) + (n_levels - 1) * window
        return Branch(
            tokens=torch.tensor([t for level in self.levels for t in level], dtype=torch.long),
            depths=depths,
            visible=self._visibility[n_levels],
            logit_rows=top,
        )
