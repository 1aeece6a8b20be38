"""Token Recycling (Luo et al., 2024): the model's own top-k guesses, kept for next time.

Every verified step computes logits for every node of the candidate tree, and most of those
predictions are thrown away with the rejected nodes. ``SuccessorTable`` keeps them: for each
token, the k tokens the model ranked highest right after it, the last time that token was in a
step (accepted or not), and the same keyed by the token and the one before it, which predicts
better where both were seen. A candidate tree is then read off the table from ``x0``: the top
successor of ``x0``, the top successor of that, and so on, plus branches that take the 2nd,
3rd, ... successor at one depth and the top ones after it.

Greedy output stays exact whatever the table holds: candidates only add tokens the verifier
checks. The table costs one top-k over the tree's logits per step (compiled where the row
operations are built: about 0.1 ms for 4 rows of 151936 logits, against 0.7 ms for
``torch.topk`` on 2 threads).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from lookahead.kernels.row_ops import built_top_k

# Rows keyed by two tokens kept at most (least recently written out first): about 100 MB at
# k = 8, for a table shared by every request of a long-running process.
PAIR_CAPACITY = 1 << 20


class SuccessorTable:
    """token (and token pair) -> its ``k`` most likely next tokens, as the model last
    predicted them.

    The rows are replaced, not merged: the latest context is the best guess of the next one.
    A table may be shared by the requests of one model (its rows are the model's, not a
    text's); it holds at most one row per vocabulary entry, and ``pair_capacity`` rows keyed
    by two tokens.
    """

    def __init__(self, k: int = 8, pair_capacity: int = PAIR_CAPACITY) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        self.k = k
        self.pair_capacity = pair_capacity
        self._rows: dict[int, list[int]] = {}
        self._pairs: OrderedDict[tuple[int, int], list[int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def record(self, tokens: Sequence[int], scores: torch.Tensor,
               before: Sequence[int | None] | None = None) -> None:
        """Keep the top ``k`` of each row of ``scores`` [T, V] as the successors of
        ``tokens[i]`` (the token whose position row i scores), and of the pair
        ``(before[i], tokens[i])`` where ``before[i]``, the token before it, is known."""
        if len(tokens) == 0:
            return
        top = top_k(scores, min(self.k, scores.shape[-1])).tolist()
        before = before if before is not None else [None] * len(tokens)
        pairs = self._pairs
        for token, prev, row in zip(tokens, before, top):
            self._rows[int(token)] = row
            if prev is not None:
                key = (int(prev), int(token))
                pairs[key] = row
                pairs.move_to_end(key)
        while len(pairs) > self.pair_capacity:
            pairs.popitem(last=False)

    def record_tree(self, tree, scores: torch.Tensor, before_root: int | None) -> None:
        """``record`` for a step's candidate tree (``lookahead.attention.TokenTree``): node i's
        row of ``scores`` [len(tree), V]; the token before the root is ``before_root``."""
        before = [before_root if p < 0 else tree.tokens[p] for p in tree.parents]
        self.record(tree.tokens, scores, before)

    def successors(self, token: int, before: int | None = None) -> list[int]:
        """The successors of ``token`` after ``before`` where that pair was seen, else of
        ``token`` alone, most likely first ([] if it was never in a step)."""
        if before is not None:
            row = self._pairs.get((before, token))
            if row is not None:
                return row
        return self._rows.get(token, [])

    def chains(self, root: int, depth: int, branches: Sequence[int],
               before: int | None = None) -> list[tuple[list[int], str]]:
        """Candidates after ``root`` (which follows ``before``), each with its label, the
        most likely first.

        The first follows the top successor ``depth`` times ("recycled"). Then, for depth
        ``d`` (1-based) and rank ``r`` in ``1 .. branches[d - 1] - 1``, one that follows the
        top successors to depth ``d - 1``, takes the rank-``r`` successor there and the top
        ones after it ("recycled@d.r"). A chain ends early where the table has no row.
        """
        main = self._follow(before, root, [], depth)
        if not main:
            return []
        out = [(main, "recycled")]
        path = [before, root, *main]  # path[d] is the token d - 1 after root
        for d, width in enumerate(branches[:depth], start=1):
            if len(main) < d - 1:
                break
            options = self.successors(path[d], path[d - 1])
            for rank in range(1, min(width, len(options))):
                head = main[: d - 1] + [options[rank]]
                out.append((self._follow(path[d], head[-1], head, depth - d),
                            f"recycled@{d}.{rank}"))
        return out

    def _follow(self, before: int | None, token: int, head: list[int], steps: int
                ) -> list[int]:
        """``head`` extended by up to ``steps`` top successors, starting after ``token``."""
        chain = list(head)
        for _ in range(steps):
            options = self.successors(token, before)
            if not options:
                break
            before, token = token, options[0]
            chain.append(token)
        return chain


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of each row's ``k`` largest scores, largest first: [..., V] -> int64
    [..., k] (the compiled one where built: equal scores by index, NaN as -inf)."""
    compiled = built_top_k()
    if (compiled is not None and scores.dim() == 2 and scores.dtype == torch.float32
            and scores.device.type == "cpu" and scores.stride(-1) == 1 and k <= 64):
        return compiled(scores, k)
    return torch.topk(scores, k, dim=-1, sorted=True).indices
