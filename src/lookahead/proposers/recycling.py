"""Token Recycling (Luo et al., 2024): the model's own top-k guesses, kept for next time.

Every verified step computes logits for every node of the candidate tree, and most of those
predictions are thrown away with the rejected nodes. ``SuccessorTable`` keeps them: for each
token, the k tokens the model ranked highest right after it, the last time that token was in a
step (accepted or not). A candidate tree is then read off the table from ``x0``: the top
successor of ``x0``, the top successor of that, and so on, plus branches that take the 2nd,
3rd, ... successor at one depth and the top ones after it.

Greedy output stays exact whatever the table holds: candidates only add tokens the verifier
checks. The table costs one ``topk`` over the tree's logits per step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class SuccessorTable:
    """token -> its ``k`` most likely next tokens, as the model last predicted them.

    The rows are replaced, not merged: the latest context is the best guess of the next one.
    A table may be shared by the requests of one model (its rows are the model's, not a
    text's); it holds at most one row per vocabulary entry.
    """

    def __init__(self, k: int = 8) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        self.k = k
        self._rows: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def record(self, tokens: Sequence[int], scores: torch.Tensor) -> None:
        """Keep the top ``k`` of each row of ``scores`` [T, V] as the successors of
        ``tokens[i]`` (the token whose position row i scores)."""
        if len(tokens) == 0:
            return
        k = min(self.k, scores.shape[-1])
        top = torch.topk(scores, k, dim=-1, sorted=True).indices.tolist()
        for token, row in zip(tokens, top):
            self._rows[int(token)] = row

    def successors(self, token: int) -> list[int]:
        """The successors of ``token``, most likely first ([] if it was never in a step)."""
        return self._rows.get(token, [])

    def chains(self, root: int, depth: int, branches: Sequence[int]) -> list[tuple[list[int], str]]:
        """Candidates after ``root``, each with its label, the most likely first.

        The first follows the top successor ``depth`` times ("recycled"). Then, for depth
        ``d`` (1-based) and rank ``r`` in ``1 .. branches[d - 1] - 1``, one that follows the
        top successors to depth ``d - 1``, takes the rank-``r`` successor there and the top
        ones after it ("recycled@d.r"). A chain ends early where the table has no row.
        """
        main = self._follow(root, [], depth)
        if not main:
            return []
        out = [(main, "recycled")]
        for d, width in enumerate(branches[:depth], start=1):
            if len(main) < d - 1:
                break
            parent = root if d == 1 else main[d - 2]
            options = self.successors(parent)
            for rank in range(1, min(width, len(options))):
                head = main[: d - 1] + [options[rank]]
                out.append((self._follow(head[-1], head, depth - d), f"recycled@{d}.{rank}"))
        return out

    def _follow(self, token: int, head: list[int], steps: int) -> list[int]:
        """``head`` extended by up to ``steps`` top successors, starting after ``token``."""
        chain = list(head)
        for _ in range(steps):
            options = self.successors(token)
            if not options:
                break
            token = options[0]
            chain.append(token)
        return chain
