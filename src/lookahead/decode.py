"""The decode loop: propose -> one forward -> verify -> accept -> roll back cache -> update.

``Decoder`` holds one request's state (KV cache, proposer, RNG, statistics). Iterating it
yields the tokens committed at each step, the prefill's first token included.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from lookahead.attention import (
    StepLayout,
    TokenTree,
    attention_mask,
    layout_step,
    mask_to,
)
from lookahead.cache import cache_keyword, cache_length, decoding_pass, keep_new, new_cache
from lookahead.config import SamplingConfig
from lookahead.prefix_cache import CachedPrefix
from lookahead.logprobs import TokenLogprob, check_logprobs, token_logprobs
from lookahead.sources.memory import TextMemory
from lookahead.proposers.base import Proposal, Proposer, StepOutcome
from lookahead.stats import GenerationStats
from lookahead.verify import (Verdict, choose, on_generator, verify_greedy, verify_sampling,
                              warp)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepPlan:
    """One step's proposal, its candidate tree and the input laid out for the forward pass."""

    proposal: Proposal
    tree: TokenTree
    layout: StepLayout


def longrope_switch(config) -> int | None:
    """For "longrope" models, the sequence length past which the long factors apply."""
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type") != "longrope":
        return None
    return rope.get("original_max_position_embeddings") or getattr(
        config, "original_max_position_embeddings", None
    )


def fit_depth(proposal: Proposal, depth: int) -> Proposal:
    """Keep proposed tokens at most ``depth`` positions after x0 (the branch whole or not at
    all), so that a step never reaches positions the plain decoder has not reached yet."""
    branch = proposal.branch
    if branch is not None and int(branch.depths.max()) > depth:
        branch = None
    candidates = [c[:depth] for c in proposal.candidates] if depth > 0 else []
    probs = proposal.draft_probs
    if probs is not None:
        probs = [p[:depth] for p in probs] if depth > 0 else None
    return Proposal(candidates, probs, branch)


def fit_budget(proposal: Proposal, budget: int | None) -> Proposal:
    """Trim ``proposal`` so that x0, the branch and the candidate trie fit in ``budget`` tokens.

    The branch is dropped first (it only feeds future steps): it stays only where it leaves
    room for a candidate token beside it, if there are candidates (a step that verifies
    nothing writes one token, as a plain one does, at a higher cost). Then candidates are
    kept in order while the trie they form still fits.
    """
    if budget is None:
        return proposal
    branch = proposal.branch
    beside = 1 if proposal.candidates else 0
    if branch is not None and 1 + len(branch.tokens) + beside > budget:
        branch = None
    room = budget - 1 - (0 if branch is None else len(branch.tokens))
    kept = 0
    while kept < len(proposal.candidates):
        if len(TokenTree(0, proposal.candidates[: kept + 1])) - 1 > room:
            break
        kept += 1
    candidates = proposal.candidates[:kept]
    probs = proposal.draft_probs[:kept] if proposal.draft_probs is not None else None
    if kept == 0 and proposal.candidates and room > 0:  # a single long chain: cut it short
        candidates = [proposal.candidates[0][:room]]
        probs = [proposal.draft_probs[0][:room]] if probs is not None else None
    return Proposal(candidates, probs, branch)


class Decoder:
    """One request: a prompt decoded by ``model`` with the help of ``proposer``.

    input_ids: LongTensor [1, prompt_len]. Tokens are committed until ``max_new_tokens`` or
    until a token in ``eos_token_ids`` (which is emitted, as ``model.generate`` does).
    ``memory``: where the finished text (prompt and output) is remembered for later requests.
    ``step_tokens``: the most tokens a step feeds the model, x0 included (``fit_budget``);
    None: all the proposer proposes.
    ``observer``: called with the name of each phase of a step as it ends ("propose", "tree",
    "layout", "forward", "verify", "commit", "update", "keep"), e.g. to time them
    (``benchmarks/forward_cost.py --times step``); None (the default) calls nothing.
    ``controls``: Hugging Face logits processors and stopping criteria applied at every
    verified position (``lookahead.controls.Controls``); None: plain logits, EOS and limit.
    ``prefix``: the KV entries of the prompt's first tokens, computed before
    (``lookahead.prefix_cache``): the prefill runs only the tokens after them.
    ``logprobs``: k (0-20) records each committed token's log-probability and the k most
    likely tokens at its position in ``token_logprobs`` (``lookahead.logprobs``: the scores
    after ``controls``, before temperature); None (the default) records nothing, at no cost.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        proposer: Proposer,
        *,
        max_new_tokens: int,
        sampling: SamplingConfig,
        eos_token_ids: Sequence[int],
        generator: torch.Generator | None = None,
        method: str = "",
        memory: TextMemory | None = None,
        step_tokens: int | None = None,
        observer: Callable[[str], None] | None = None,
        controls=None,
        prefix: CachedPrefix | None = None,
        logprobs: int | None = None,
    ) -> None:
        self.model = model
        self.logprobs = check_logprobs(logprobs)
        self.token_logprobs: list[TokenLogprob] = []  # one per committed token, if asked
        self.observer = observer
        self.controls = controls
        self.step_tokens = step_tokens
        self.proposer = proposer
        self.sampling = sampling
        self.max_new_tokens = max_new_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.generator = generator
        self.memory = memory
        self.prefix = prefix
        self.cache = new_cache()
        self.cache_keyword = cache_keyword(model)  # "cache" or "past_key_values"
        self.prompt = input_ids[0].tolist()
        self.context: list[int] = list(self.prompt)
        self.stats = GenerationStats(method=method, prompt_tokens=len(self.prompt))
        self.finished = False
        self.position_limit = getattr(model.config, "max_position_embeddings", None)
        self.rope_switch = longrope_switch(model.config)
        self._rope_cached_at = len(self.prompt)  # text length when the cache was last computed

    def __iter__(self) -> Iterator[list[int]]:
        start = time.perf_counter()
        committed = self.prefill()
        self.stats.time_to_first_token = self.stats.seconds = time.perf_counter() - start
        yield committed
        while not self.finished:
            committed = self._step()
            self.stats.seconds = time.perf_counter() - start
            yield committed
        logger.debug("decoded %d tokens in %d steps", self.stats.new_tokens, self.stats.steps)

    @property
    def new_tokens(self) -> list[int]:
        return self.context[len(self.prompt) :]

    @property
    def reused(self) -> int:
        """How many of the prompt's first tokens ``prefix`` holds (at most all but the last,
        whose logits the prefill must compute)."""
        if self.prefix is None:
            return 0
        return min(self.prefix.length, len(self.prompt) - 1)

    @torch.inference_mode()
    def prefill(self, length: int | None = None) -> list[int]:
        """Run the prompt once (its KV stays cached for good) and choose the first token.

        With a ``prefix``, its entries are copied into the cache and only the prompt's tokens
        after it are run. ``length``: feed those right-padded to this many tokens (the server
        keeps the shapes of its forward passes few, see ``lookahead.server.shapes``). Causal
        attention keeps the prompt's entries and logits free of the padding, whose entries
        are dropped. It is capped where it would change the prompt's rotary factors or overrun
        positions.
        """
        start = self.reused
        if start:
            self.cache = CachedPrefix(start, tuple(
                (k[:, :, :start], v[:, :, :start]) for k, v in self.prefix.layers)).to_cache()
        fed = self.prompt[start:]
        length = self._padded_length(length, start)
        ids = torch.tensor([fed + fed[-1:] * (length - len(fed))], dtype=torch.long,
                           device=self.model.device)
        keep = 1 if length == len(fed) else torch.tensor([len(fed) - 1], device=ids.device)
        out = self._run_model(input_ids=ids, logits_to_keep=keep)
        keep_new(self.cache, len(self.prompt), [])  # drops the padding's entries, if any
        self.prefix = None  # copied: the stored entries may go
        self.stats.cached_prompt_tokens = start
        scores = self._scores(out.logits[0, -1:])
        token = choose(scores[0], self.sampling, self.generator, len(self.context))
        self.stats.record_step(forward_tokens=length, proposed=0, accepted=0)
        self.proposer.start(self.prompt)
        return self._note_logprobs(scores, [0], self._commit([token]))

    def _padded_length(self, length: int | None, start: int = 0) -> int:
        """How many tokens the prefill feeds after the ``start`` reused ones: ``length``
        where that stays inside the rotary factors and positions of the prompt."""
        n = len(self.prompt) - start
        if length is None or length <= n:
            return n
        for limit in (self.rope_switch, self.position_limit):
            if limit is not None and start + n <= limit:
                length = min(length, limit - start)
        return length

    @torch.inference_mode()
    def _step(self) -> list[int]:
        past = cache_length(self.cache)  # every committed token but x0 = context[-1]
        if self.rope_switch is not None and past >= self.rope_switch > self._rope_cached_at:
            return self._recompute()
        plan = self.plan(past)  # 1. propose
        start = time.perf_counter()
        logits = self._forward(plan.layout, past)  # 2. one forward pass
        seconds = time.perf_counter() - start  # what a pass of this size costs now
        if self.observer is not None:
            self.observer("forward")
        committed, keep = self.finish(plan, logits, seconds)  # 3. verify, 4. accept, 6. update
        keep_new(self.cache, past, keep)  # 5. roll back the cache to the accepted tokens
        if self.observer is not None:
            self.observer("keep")
        return committed

    def plan(self, past: int, budget: int | None = None) -> StepPlan:
        """Step 1: propose candidates (and the lookahead window) and lay out the step's input.

        ``budget`` caps the step's input tokens (x0 included): the server shares one forward
        pass between requests. The window goes first, then candidates beyond the budget. The
        request's own ``step_tokens`` caps it too.
        """
        if self.step_tokens is not None:
            budget = self.step_tokens if budget is None else min(budget, self.step_tokens)
        room = self.max_new_tokens - self.stats.new_tokens - 1  # the bonus token needs one
        if budget is not None:
            # Deeper candidates would be cut anyway; a draft model is spared their passes.
            room = min(room, budget - 1)
        proposal = self.proposer.propose(self.context, max_tokens=room)
        depth = self._depth_limit(past)
        if depth is not None:
            proposal = fit_depth(proposal, depth)
        proposal = fit_budget(proposal, budget)
        observer = self.observer
        if observer is not None:
            observer("propose")
        tree = TokenTree(self.context[-1], proposal.candidates)
        if observer is not None:
            observer("tree")
        layout = layout_step(tree, proposal.branch, position=past)
        if observer is not None:
            observer("layout")
        return StepPlan(proposal, tree, layout)

    def finish(self, plan: StepPlan, logits: torch.Tensor, seconds: float | None = None
               ) -> tuple[list[int], list[int]]:
        """Steps 3, 4 and 6 on the step's logits [R, V] (tree rows first, then branch rows);
        ``seconds``: how long the forward pass took, where it was this request's alone.

        Returns the committed tokens and the step-input rows whose KV entries stay cached
        (x0 and the accepted nodes).
        """
        tree, proposal = plan.tree, plan.proposal
        # 3. Verify: the longest acceptable root path, then a bonus or recovered token.
        scores = self._scores(logits[: len(tree)], tree)
        verdict = self._verify(tree, scores, proposal)
        observer = self.observer
        if observer is not None:
            observer("verify")
        # 4. Accept: commit the tokens, stopping at EOS or at max_new_tokens.
        committed = self._note_logprobs(scores, [0] + verdict.nodes, self._commit(verdict.tokens))
        accepted = min(len(verdict.nodes), len(committed))  # none count past an EOS or the limit
        fed = plan.layout.input_ids.shape[1]
        self.stats.record_step(fed, len(tree) - 1, accepted)
        if observer is not None:
            observer("commit")
        # 6. Let the proposer learn from what happened.
        branch_logits = logits[len(tree) :] if proposal.branch is not None else None
        self.proposer.update(self.context, StepOutcome(
            committed, accepted, branch_logits, fed if seconds is not None else None, seconds,
            tree, scores))
        if observer is not None:
            observer("update")
        return committed, [0] + verdict.nodes  # tree node i sits at row i

    def _depth_limit(self, past: int) -> int | None:
        """How far past x0 (at position ``past``) a step may place tokens: never beyond the
        model's positions, nor across a long-RoPE switch the plain decoder has not reached."""
        limits = []
        if self.position_limit is not None:
            limits.append(self.position_limit - 1 - past)
        if self.rope_switch is not None and past < self.rope_switch:
            limits.append(self.rope_switch - 1 - past)
        return min(limits) if limits else None

    def _recompute(self) -> list[int]:
        """Re-run the whole text once it reaches a long-RoPE model's switch point.

        Phi-3-style "longrope" models rotate with short factors while the sequence fits in
        ``original_max_position_embeddings`` and with long ones beyond; ``model.generate``
        then recomputes the cache with the long factors, and so do we, at the same token.
        """
        self.cache = new_cache()
        self._rope_cached_at = len(self.context)
        ids = torch.tensor([self.context], dtype=torch.long, device=self.model.device)
        out = self._run_model(input_ids=ids, logits_to_keep=1)
        scores = self._scores(out.logits[0, -1:])
        token = choose(scores[0], self.sampling, self.generator, len(self.context))
        committed = self._note_logprobs(scores, [0], self._commit([token]))
        self.stats.record_step(len(self.context), 0, 0)
        self.proposer.update(self.context, StepOutcome(committed, 0, None))
        return committed

    def _forward(self, layout: StepLayout, past: int) -> torch.Tensor:
        """Logits [C + R, V] of the layout's logit rows (tree rows, then branch rows)."""
        device = self.model.device
        mask, keep = None, 0
        if layout.visible is not None:
            config, dtype = self.model.config, self.model.dtype
            mask = attention_mask(config, layout.visible, past, layout.position_ids, dtype)
            mask = mask_to(mask, device)
            keep = layout.logit_rows.to(device)
        out = self._run_model(
            input_ids=layout.input_ids.to(device),
            position_ids=layout.position_ids.to(device),
            attention_mask=mask,
            logits_to_keep=keep,
        )
        return out.logits[0]

    def _scores(self, logits: torch.Tensor, tree: TokenTree | None = None) -> torch.Tensor:
        """Logits [R, V] of ``tree``'s nodes (None: the one position after the text) after
        the request's logits processors, if it has any."""
        if self.controls is None:
            return logits
        return self.controls.scores(self.context, tree, logits)

    def _note_logprobs(self, scores: torch.Tensor, rows: list[int], committed: list[int]
                       ) -> list[int]:
        """Record the log-probabilities of ``committed`` (if asked), token i chosen from row
        ``rows[i]`` of ``scores`` [R, V]; return ``committed``."""
        if self.logprobs is not None and committed:
            chosen = scores[rows[: len(committed)]]
            self.token_logprobs += token_logprobs(chosen, committed, self.logprobs)
        return committed

    def _run_model(self, **inputs):
        """One forward pass through the request's cache."""
        return decoding_pass(self.model, self.cache_keyword, self.cache, **inputs)

    def _verify(self, tree: TokenTree, logits: torch.Tensor, proposal: Proposal) -> Verdict:
        if not self.sampling.do_sample:
            return verify_greedy(tree, logits)
        draft = None
        if proposal.draft_probs is not None:
            draft = {
                n: on_generator(proposal.draft_probs[c][o], self.generator)
                for n, (c, o) in enumerate(tree.source) if n
            }
        # The draws happen where the request's generator lives (the model's device); those of
        # deterministic candidates are keyed by the tokens' positions (the text is the seed's).
        probs = on_generator(warp(logits, self.sampling), self.generator)
        return verify_sampling(tree, probs, self.generator, draft, position=len(self.context))

    def _commit(self, tokens: list[int]) -> list[int]:
        """Append ``tokens`` up to the first EOS (kept) and the token limit; return them."""
        room = self.max_new_tokens - self.stats.new_tokens
        kept = tokens[:room]
        for i, token in enumerate(kept):
            if token in self.eos_token_ids or (
                self.controls is not None and self.controls.stops(self.context, kept[: i + 1])
            ):
                kept = kept[: i + 1]
                self.finished = True
                break
        self.context.extend(kept)
        self.stats.new_tokens += len(kept)
        if self.stats.new_tokens >= self.max_new_tokens:
            self.finished = True
        if self.finished and self.memory is not None:
            self.memory.add(self.context)
        return kept
