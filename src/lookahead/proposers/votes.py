"""Which continuations of the last token to verify: votes from earlier text, heaviest first.

Every earlier occurrence of ``x0`` (the text's last token) votes for the tokens that followed
it. A vote weighs more the more of the context before ``x0`` also stood before that occurrence
(``CONTEXT_WEIGHT`` per matching token, up to ``SPAN``): ``... for i in range(`` predicts the
next tokens better than ``(`` alone. The votes add up in a trie of continuations, and a step
verifies the heaviest nodes that fit its token budget. Continuations many occurrences agree on
win, prefixes they share are fed once, and the budget goes where acceptance is likeliest.

On the first 20 HumanEval prompts with Qwen2.5-Coder-1.5B (its greedy outputs replayed, memory
of earlier answers on, W2 N4 G2), this took the text's candidates from 1.89 to 2.00 tokens per
step at about the same forward tokens (6.5 -> 6.9); on MT-Bench from 1.30 to 1.35.

Example::

    votes = VoteTree(depth=2)
    votes.add([7, 8, 9], weight=4.0)
    votes.add([7, 5], weight=1.0)
    votes.add([7, 8, 1], weight=1.0)
    votes.heaviest(budget=3)  # nodes 7 (6.0), 7 8 (5.0), 7 5 (1.0) -> ([[7, 8], [7, 5]], [True, True])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# How many context tokens before x0 a match is measured over, and what each one multiplies a
# vote by: an occurrence after the same 2 tokens outweighs 16 after none.
SPAN = 6
CONTEXT_WEIGHT = 4.0
# Occurrences kept per source, best matched (then latest) first: on HumanEval with Qwen, 16
# to 64 gave the same acceptance, and each costs a few dict updates per step.
OCCURRENCES = 32


def context_matches(tokens: np.ndarray, stop: int, context: Sequence[int], start: int = 0,
                    limit: int = OCCURRENCES) -> tuple[np.ndarray, np.ndarray]:
    """Where ``context[-1]`` occurs in ``tokens[start:stop]``, with how long a match each has.

    A match is how many of the up to ``SPAN`` tokens before ``context[-1]`` in the context
    also stand, in order, just before the occurrence. Negative tokens (separators between
    texts) never match.

    Args:
        tokens: int64 [T], the text to search.
        stop, start: search ``tokens[start:stop]`` only (``stop`` leaves out the context's own
            last token); the tokens before ``start`` still count towards a match.
        context: the text so far; its last token is x0.
        limit: keep this many occurrences: longest match first, then the latest.

    Returns:
        (positions, lengths), int64 [K] each, K <= limit.

    Example: tokens ``[1, 2, 9, 2, 3, 2]``, stop 5, context ``[1, 2]`` -> positions ``[1, 3]``,
    lengths ``[1, 0]`` (the 2 at index 1 follows a 1, as in the context).
    """
    hits = np.flatnonzero(tokens[start:stop] == context[-1]) + start
    lengths = np.zeros(hits.size, dtype=np.int64)
    alive = np.ones(hits.size, dtype=bool)
    for back in range(1, min(SPAN, len(context) - 1) + 1):
        before = hits - back
        alive &= before >= 0
        alive[alive] = tokens[before[alive]] == context[-1 - back]
        if not alive.any():
            break
        lengths += alive
    order = np.lexsort((hits, lengths))[::-1][:limit]
    return hits[order], lengths[order]


def continuation(tokens: np.ndarray, position: int, depth: int) -> list[int]:
    """Up to ``depth`` tokens after ``tokens[position]``, cut at a separator (a negative)."""
    tail = tokens[position + 1 : position + 1 + depth].tolist()
    for i, token in enumerate(tail):
        if token < 0:
            return tail[:i]
    return tail


class VoteTree:
    """A trie of weighted continuations, each node's weight the sum of the votes through it.

    ``depth``: continuations are cut to this many tokens. ``from_text`` marks votes that come
    from the text itself (not a guess), so that each chosen candidate can say whether the text
    alone would have proposed it.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        # path (token tuple) -> [weight, weight from the text]; insertion order breaks ties
        self._nodes: dict[tuple[int, ...], list[float]] = {}

    def add(self, tokens: Sequence[int], weight: float, from_text: bool = True) -> None:
        for end in range(1, min(len(tokens), self.depth) + 1):
            node = self._nodes.setdefault(tuple(tokens[:end]), [0.0, 0.0])
            node[0] += weight
            if from_text:
                node[1] += weight

    def heaviest(self, budget: int) -> tuple[list[list[int]], list[bool]]:
        """The leaves of the ``budget`` heaviest nodes, heaviest first, and for each whether
        text votes reached it.

        A node weighs no more than its parent and ties go to the shallower, so the heaviest
        nodes always include their prefixes: the leaves, fed as a tree, are exactly them.
        """
        ranked = sorted(self._nodes.items(), key=lambda kv: (-kv[1][0], len(kv[0])))
        chosen = dict(ranked[:budget])
        parents = {path[:-1] for path in chosen}
        leaves = [path for path in chosen if path not in parents]
        return [list(p) for p in leaves], [chosen[p][1] > 0 for p in leaves]
