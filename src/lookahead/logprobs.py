"""Log-probabilities of committed tokens, as the OpenAI API reports them (``logprobs``).

A ``Decoder`` built with ``logprobs=k`` records, for every token it commits, the token's
log-probability and the ``k`` most likely tokens at that position. The distribution is the
log-softmax of the scores the token was chosen from: the model's logits after the request's
logits processors (penalties, ``logit_bias``: ``lookahead.penalties``), before temperature,
top-k and top-p. Without processors that is the raw model distribution, which is what vLLM
reports by default; with them, a greedy token is always the first of its ``top`` list, and
the figures say how the processed distribution the token was chosen from looked. A
speculative step verifies several positions in one forward pass; the row each committed token
was chosen from is the one a plain one-token-at-a-time decoder would have computed, so the
figures do not depend on the method.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One committed token: its id, its log-probability, and the ``k`` most likely tokens at
    its position as ``(token id, log-probability)``, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def check_logprobs(value) -> int | None:
    """``value`` as a ``Decoder``'s ``logprobs``: None, or an int in [0, MAX_TOP_LOGPROBS]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs must be None or an int in [0, {MAX_TOP_LOGPROBS}] (how many "
                         f"most likely tokens to report per position), got {value!r}")
    return value


def token_logprobs(scores: torch.Tensor, tokens: Sequence[int], k: int) -> list[TokenLogprob]:
    """scores: [N, V], row i the scores ``tokens[i]`` was chosen from; k: top tokens per row.

    Computed in float32, or float64 for float64 scores (never in half precision).
    """
    dtype = torch.promote_types(scores.dtype, torch.float32)
    logp = scores.to(dtype).log_softmax(dim=-1)
    index = torch.tensor(list(tokens), dtype=torch.long, device=logp.device)
    chosen = logp.gather(1, index.unsqueeze(1))[:, 0].tolist()
    if k == 0:
        return [TokenLogprob(int(t), float(c)) for t, c in zip(tokens, chosen)]
    values, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)  # sorted, most likely first
    values, ids = values.tolist(), ids.tolist()
    return [TokenLogprob(int(t), float(c), tuple(zip(i, v)))
            for t, c, i, v in zip(tokens, chosen, ids, values)]
