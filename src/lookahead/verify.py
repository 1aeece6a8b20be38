"""The one verifier: which proposed tokens the target model accepts.

Terms (as in vLLM's rejection sampler and the speculative-decoding papers):

* *accepted* tokens: proposed tokens the target keeps, a path from the root of the candidate
  tree (``x0``) downwards;
* *recovered* token: when a proposal is rejected, the token drawn from the residual
  distribution in its place;
* *bonus* token: when a whole path is accepted, the target's own next token after it.

Every step therefore yields ``len(accepted) + 1`` tokens.

Greedy (``do_sample=False``): follow the child whose token is the target's argmax; the first
miss gives the bonus. This is exactly what one-token greedy decoding would produce.

Sampling: at each tree node with target distribution ``p`` the children are tried in order.
A child proposed with distribution ``q`` (a draft model) is accepted with probability
``min(1, p(x) / q(x))``, otherwise ``p <- norm(max(p - q, 0))`` and the next child is tried;
when none is accepted the recovered token is drawn from ``p``. This is speculative sampling
(Leviathan et al., 2023; Chen et al., 2023) for one child, and for several children the
multi-candidate rule of SpecInfer (Miao et al., 2024) that lookahead decoding adopts for
sampling (Fu et al., 2024, Sec. 3.4): n-gram candidates are deterministic, so ``q`` is a point
mass, the acceptance probability is ``p(x)`` and the residual is ``p`` with ``x`` removed.
Each draw leaves the output distributed exactly as ``p``.

Where every child is proposed deterministically (lookahead, prompt lookup) and the text's
positions are known, the draws are keyed by position instead (``position``): at each node
the target's own token is drawn from ``p`` by inverting its cumulative sum at a uniform that
the request's seed and the token's position in the text alone decide (``position_draw``),
and the child with that token, if any, is accepted. A child is then accepted with
probability ``p(x)`` and several with ``sum p(x)``, as above, and the step writes what
one-token sampling with the same seed writes at those positions (``choose`` draws the
same way), whatever the candidates: the speed may change the candidates (the step costs
are measured as the request runs), never the text of a seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lookahead.attention import TokenTree
from lookahead.config import SamplingConfig
from lookahead.kernels.row_ops import built_argmax


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one tree.

    nodes: accepted tree nodes in order (root excluded). tokens: their tokens followed by the
    bonus or recovered token, so ``len(tokens) == len(nodes) + 1``.
    """

    nodes: list[int]
    tokens: list[int]


def warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Logits [..., V] -> probabilities [..., V] (float32) after temperature, top-k, top-p.

    Mirrors Hugging Face's ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and
    ``TopPLogitsWarper`` (in that order, keeping at least one token) so that our sampling draws
    from the same distribution as ``model.generate(do_sample=True)``.
    """
    scores = logits.float() / sampling.temperature
    if sampling.top_k and sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - sampling.top_p)
        remove_sorted[..., -1:] = False
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores.softmax(dim=-1)


ARGMAX_BLOCK = 128  # logits a block of the CPU argmax


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``: logits [..., V] -> int64 [...], the first maximum's index (the
    first NaN's where a row holds one), as ``torch.argmax`` gives it.

    On a CPU, PyTorch's index-tracking reductions (``argmax``, ``max(dim)``) are not
    vectorized: 130 us a row of 151936 float32 logits, against 8 us for ``amax``. Where the
    row operations are built (a quantized model), one compiled pass finds it (about 100 us
    for 3 rows right after a forward pass, against 330 us below). Else the row is cut into
    blocks of ``ARGMAX_BLOCK``: ``amax`` of every block, the first block that holds the
    row's maximum, and the index inside that block alone.
    """
    if logits.device.type != "cpu" or logits.shape[-1] < 4 * ARGMAX_BLOCK:
        return logits.max(dim=-1).indices
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)
    compiled = built_argmax()
    if compiled is not None and rows.dtype == torch.float32 and rows.stride(-1) == 1:
        return compiled(rows).reshape(logits.shape[:-1])
    blocks = vocab // ARGMAX_BLOCK
    head = rows[:, : blocks * ARGMAX_BLOCK].unflatten(-1, (blocks, ARGMAX_BLOCK))
    block = head.amax(dim=-1).max(dim=-1).indices  # amax propagates NaN, as max does
    inside = head[torch.arange(rows.shape[0]), block].max(dim=-1)
    index = block * ARGMAX_BLOCK + inside.indices
    if vocab % ARGMAX_BLOCK:  # the last, shorter block counts only where it beats the rest
        tail = rows[:, blocks * ARGMAX_BLOCK:].max(dim=-1)
        beats = (tail.values > inside.values) | (tail.values.isnan() & ~inside.values.isnan())
        index = torch.where(beats, blocks * ARGMAX_BLOCK + tail.indices, index)
    return index.reshape(logits.shape[:-1])


def verify_greedy(tree: TokenTree, logits: torch.Tensor) -> Verdict:
    """Longest root path whose every token is the target's argmax. logits: [len(tree), V]."""
    best = argmax(logits).tolist()
    node, path = 0, []
    while (child := tree.children[node].get(best[node])) is not None:
        path.append(child)
        node = child
    return Verdict(path, [tree.tokens[n] for n in path] + [best[node]])


def verify_sampling(
    tree: TokenTree,
    probs: torch.Tensor,
    generator: torch.Generator,
    draft_probs: dict[int, torch.Tensor] | None = None,
    position: int | None = None,
) -> Verdict:
    """Rejection-sample a root path. probs: [len(tree), V] warped target distributions.

    draft_probs maps a tree node to the distribution [V] its token was drawn from; nodes not in
    it were proposed deterministically (point mass). position: where in the text the root's
    next token goes; with no draft_probs, the draws are keyed by position (the module's text).
    """
    if position is not None and not draft_probs:
        return _verify_by_position(tree, probs, generator, position)
    draft_probs = draft_probs or {}
    node, path = 0, []
    while True:
        p = probs[node]
        accepted = None
        for token, child in tree.children[node].items():
            q = draft_probs.get(child)
            ratio = p[token] if q is None else torch.clamp(p[token] / q[token], max=1.0)
            if torch.rand((), generator=generator, device=generator.device) < ratio:
                accepted = child
                break
            p = _residual(p, token, q)
        if accepted is None:
            recovered = int(torch.multinomial(p, 1, generator=generator))
            return Verdict(path, [tree.tokens[n] for n in path] + [recovered])
        path.append(accepted)
        node = accepted


def _verify_by_position(tree: TokenTree, probs: torch.Tensor, generator: torch.Generator,
                        position: int) -> Verdict:
    """The root path of the tokens drawn at each node from probs [len(tree), V] with the
    draws of ``position``, ``position + 1``, ...: the first drawn token that no child holds
    ends it."""
    node, path = 0, []
    while True:
        token = inverse_cdf(probs[node], position_draw(generator, position + len(path)))
        child = tree.children[node].get(token)
        if child is None:
            return Verdict(path, [tree.tokens[n] for n in path] + [token])
        path.append(child)
        node = child


# An odd 64-bit constant (2^64 / golden ratio) that spreads positions over the seed space.
_SPREAD = 0x9E3779B97F4A7C15


def position_draw(generator: torch.Generator, position: int) -> torch.Tensor:
    """A uniform draw in [0, 1) (a 0-d float32 tensor on ``generator``'s device) that the
    seed ``generator`` started from and ``position`` alone decide, whatever was drawn
    before."""
    keyed = torch.Generator(device=generator.device)
    keyed.manual_seed((generator.initial_seed() ^ (position * _SPREAD)) & ((1 << 64) - 1))
    return torch.rand((), generator=keyed, device=generator.device)


def inverse_cdf(p: torch.Tensor, u: torch.Tensor) -> int:
    """The token whose share of the cumulative sum of ``p`` [V] (not normalised) holds
    ``u`` in [0, 1): a draw from ``p``, never a token of probability 0."""
    cdf = p.cumsum(0)
    token = int(torch.searchsorted(cdf, u * cdf[-1], right=True).clamp(max=p.shape[0] - 1))
    if p[token] <= 0:  # rounding at the top: the last token p allows
        token = int(torch.nonzero(p > 0)[-1])
    return token


def _residual(p: torch.Tensor, token: int, q: torch.Tensor | None) -> torch.Tensor:
    """norm(max(p - q, 0)); for a point mass q at ``token``, p with that token removed."""
    if q is None:
        residual = p.clone()
        residual[token] = 0.0
    else:
        residual = torch.clamp(p - q, min=0.0)
    total = residual.sum()
    # A zero residual means p == q, where rejection has probability zero: keep p to stay safe.
    return residual / total if total > 0 else p


def choose(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None,
           position: int | None = None) -> int:
    """The next token from one row of logits [V]: argmax, or a draw from the warped
    distribution (keyed by the token's ``position`` in the text where given and the request
    has a generator, as ``verify_sampling`` draws)."""
    if not sampling.do_sample:
        return int(argmax(logits))
    probs = on_generator(warp(logits, sampling), generator)
    if position is not None and generator is not None:
        return inverse_cdf(probs, position_draw(generator, position))
    return int(torch.multinomial(probs, 1, generator=generator))


def on_generator(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``probs`` on the device of ``generator`` (a request's, made on the model's device), where
    the draws happen: a no-op where they already are."""
    return probs if generator is None else probs.to(generator.device)
