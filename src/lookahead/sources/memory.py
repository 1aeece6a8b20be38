"""Text of earlier requests, kept so that later ones can copy from it.

A request's own text often holds too little repetition to copy much from (on the first 20
HumanEval prompts with Qwen2.5-Coder-1.5B, even the best earlier continuation of the last token
would give 1.73 tokens per step); answers to *other* prompts hold the same idioms
(``for i in range(len(``, ``return result``). ``TextMemory`` keeps the finished texts
(prompt and output) of earlier requests; the lookahead and prompt lookup proposers copy from it
when the request's own text has no match. One memory object is shared by the requests a caller
chooses (a benchmark's method, a server); it never changes what greedy decoding outputs, only
what is proposed.

Example::

    memory = TextMemory()
    lookahead.generate(model, ids_1, method="lookahead", memory=memory)  # remembered at the end
    lookahead.generate(model, ids_2, method="lookahead", memory=memory)  # may copy from ids_1's
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from lookahead.config import check_int

# Tokens a memory keeps unless told otherwise: a few hundred answers.
DEFAULT_CAPACITY = 1 << 16


class TextMemory:
    """Finished texts, newest last, at most ``capacity`` tokens in all (oldest texts go first).

    ``find`` answers from an index of every n-gram (n = ``min_ngram`` .. ``max_ngram``) to
    where it last occurred, so a lookup costs a dict access whatever the memory's size.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, max_ngram: int = 3, min_ngram: int = 2) -> None:
        self.capacity = check_int("capacity", capacity, 1, 1 << 30)
        self.max_ngram = check_int("max_ngram", max_ngram, 1, 64)
        self.min_ngram = check_int("min_ngram", min_ngram, 1, self.max_ngram)
        self._texts: deque[tuple[int, ...]] = deque()
        self._tokens = 0
        # n-gram -> (text, index after the n-gram) of its latest occurrence with a continuation
        self._latest: dict[tuple[int, ...], tuple[tuple[int, ...], int]] = {}

    def add(self, tokens: Sequence[int]) -> None:
        """Remember one finished text (token ids); forget the oldest texts beyond capacity."""
        try:
            text = tuple(int(t) for t in tokens[-self.capacity :])
        except (TypeError, ValueError):
            raise TypeError("tokens must be a sequence of token ids (ints), got "
                            f"{type(tokens).__name__}") from None
        self._texts.append(text)
        self._tokens += len(text)
        self._index(text)
        while self._tokens > self.capacity:
            self._forget(self._texts.popleft())

    def find(self, context: Sequence[int], length: int) -> list[int]:
        """Up to ``length`` tokens that followed the latest remembered occurrence of the
        context's last n-gram, longest n first; [] when none occurred.

        Example: after ``add([5, 1, 2, 3, 4])``, ``find([9, 1, 2], 2)`` is ``[3, 4]``.
        """
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            hit = self._latest.get(tuple(context[-n:]))
            if hit is not None:
                text, start = hit
                return list(text[start : start + length])
        return []

    def __len__(self) -> int:
        """Tokens remembered."""
        return self._tokens

    def _index(self, text: tuple[int, ...]) -> None:
        for ngram, start in self._ngrams(text):
            self._latest[ngram] = (text, start)

    def _forget(self, text: tuple[int, ...]) -> None:
        """Drop the oldest text. Its index entries go unless a newer text has taken them over
        (no older text is left to fall back to), so a full memory costs O(len(text)) per add
        rather than a rebuild of the whole index."""
        self._tokens -= len(text)
        for ngram, _ in self._ngrams(text):
            hit = self._latest.get(ngram)
            if hit is not None and hit[0] is text:  # this very tuple, not an equal newer text
                del self._latest[ngram]

    def _ngrams(self, text: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], int]]:
        """(n-gram, index after it) for every n-gram followed by at least one token, each n
        in order of position (so a later occurrence overwrites an earlier one)."""
        for n in range(self.min_ngram, self.max_ngram + 1):
            for start in range(len(text) - n):
                yield text[start : start + n], start + n
