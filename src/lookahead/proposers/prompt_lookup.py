"""Prompt lookup decoding: copy what followed the text's last n-gram when it appeared before."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lookahead.config import PromptLookupConfig
from lookahead.sources.datastore import Datastore
from lookahead.sources.memory import TextMemory
from lookahead.proposers.base import Proposal, ProposerInputs, StepOutcome


def find_continuation(
    tokens: Sequence[int], max_ngram: int, min_ngram: int, length: int
) -> list[int]:
    """Up to ``length`` tokens that followed the first earlier occurrence of the last n-gram.

    Longer n-grams are tried first (n = max_ngram .. min_ngram): a longer match predicts better.
    The first occurrence (as Hugging Face's prompt lookup takes) rather than the latest: the
    latest is often just behind the suffix, so little text follows it, while the first is
    usually in the prompt, which the output tends to copy. On SmolLM2 and the first 5 HumanEval
    prompts this took prompt lookup from 40 to 55 tok/s.

    Example: tokens ``[1, 2, 3, 4, 9, 2, 3]``, max_ngram=2, length=2: the last 2-gram ``2, 3``
    occurred at index 1, followed by ``4, 9`` -> ``[4, 9]``.
    """
    arr = np.asarray(tokens, dtype=np.int64)
    ends, matched = _earlier_matches(arr, max_ngram)
    if matched < max(min_ngram, 1):
        return []
    start = int(ends[0]) + 1
    return arr[start : start + length].tolist()


def longest_match(tokens: Sequence[int], max_context: int, length: int
                  ) -> tuple[list[int], int]:
    """Up to ``length`` tokens that followed an earlier occurrence of the last token, and how
    many tokens of context matched there (0 when the last token has not occurred before).

    Of the earlier occurrences, the one whose preceding tokens match those before the last
    token longest wins (up to ``max_context`` tokens in all, the last token included), the
    latest on a tie: a longer match predicts better, and a later one is closer in topic.

    Example: tokens ``[5, 1, 2, 7, 1, 2, 8, 2]``, max_context=3, length=2: the last token 2
    occurred at indices 2 and 5, each after a 1, which the text's last-but-one token (8) is
    not; a tie at 1 token, so the latest: ``([8, 2], 1)``.
    """
    arr = np.asarray(tokens, dtype=np.int64)
    ends, matched = _earlier_matches(arr, max_context)
    if matched == 0:
        return [], 0
    start = int(ends[-1]) + 1
    return arr[start : start + length].tolist(), matched


def _earlier_matches(arr: np.ndarray, max_context: int) -> tuple[np.ndarray, int]:
    """Where the text's longest suffix that occurred earlier ends there (indices, increasing),
    and its length (at most ``max_context``); every such end has a token after it and the
    suffix never matches itself. (empty, 0) when the last token never occurred before.

    The last token's occurrences are found once and then kept while one more token before
    each matches too: a step's cost grows with the occurrences, not with the text times n.
    """
    last = len(arr) - 1
    if last < 1 or max_context < 1:
        return arr[:0], 0
    ends = np.flatnonzero(arr[:-1] == arr[-1])
    if ends.size == 0:
        return ends, 0
    matched = 1
    while matched < min(max_context, last):
        before = ends - matched
        longer = ends[(before >= 0) & (arr[np.maximum(before, 0)] == arr[last - matched])]
        if longer.size == 0:
            break
        ends, matched = longer, matched + 1
    return ends, matched


class CopyLength:
    """How many tokens the next copied continuation may have: ``first``, doubled after each copy
    the step accepts whole (a passage being repeated tends to go on) up to ``most``, and back
    to ``first`` after a copy that is not. ``most <= first`` keeps it at ``first``.

    Example: first=8, most=32: copies of 8, 16, 32, 32 accepted whole, then one cut short -> 8.
    """

    def __init__(self, first: int, most: int) -> None:
        self.first = first
        self.most = most
        self.value = first

    def reset(self) -> None:
        self.value = self.first

    def judge(self, copied: list[int], committed: list[int]) -> None:
        """Learn from a step that proposed ``copied`` and committed ``committed``."""
        if not copied or self.most <= self.first:
            return
        if committed[: len(copied)] == copied:
            self.value = min(2 * self.value, self.most)
        else:
            self.value = self.first


class PromptLookupProposer:
    """Proposes one candidate copied from earlier text (prompt and output alike), else from
    ``memory``, the texts of earlier requests (see ``lookahead.sources.memory``), else from
    ``datastore``, a corpus (see ``lookahead.sources.datastore``)."""

    def __init__(self, config: PromptLookupConfig, memory: TextMemory | None = None,
                 datastore: Datastore | None = None) -> None:
        self.config = config
        self.memory = memory
        self.datastore = datastore
        self._sources = [s for s in (memory, datastore) if s is not None]
        self.length = CopyLength(config.num_draft_tokens, config.max_draft_tokens)
        self._copied: list[int] = []  # this step's copy

    @classmethod
    def build(cls, config: PromptLookupConfig, inputs: ProposerInputs) -> PromptLookupProposer:
        """The proposer of ``method="prompt_lookup"`` (``MethodSpec.proposer``)."""
        return cls(config, memory=inputs.memory, datastore=inputs.datastore)

    def start(self, prompt: list[int]) -> None:
        self.length.reset()

    def propose(self, context: list[int], max_tokens: int) -> Proposal:
        self._copied = []  # so that a step without a copy leaves the length alone
        length = min(self.length.value, max_tokens)
        if length <= 0:
            return Proposal()
        cfg = self.config
        if not self._sources:
            match = find_continuation(context, cfg.max_ngram, cfg.min_ngram, length)
        else:
            # A 1-gram matches almost always, and guesses worse than the sources' n-grams.
            match = find_continuation(context, cfg.max_ngram, max(cfg.min_ngram, 2), length)
            for source in self._sources:
                match = match or source.find(context, length)
            if not match and cfg.min_ngram == 1:
                match = find_continuation(context, 1, 1, length)
        self._copied = match
        return Proposal([match]) if match else Proposal()

    def update(self, context: list[int], outcome: StepOutcome) -> None:
        self.length.judge(self._copied, outcome.committed)
