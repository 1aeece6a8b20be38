"""Draft-model speculative decoding: a small model with the same vocabulary proposes tokens."""

from __future__ import annotations

import torch

from lookahead.cache import cache_keyword, cache_length, decoding_pass, keep_new, new_cache
from lookahead.config import DraftConfig, SamplingConfig
from lookahead.proposers.base import Proposal, ProposerInputs, StepOutcome, vocab_size
from lookahead.proposers.prompt_lookup import find_continuation
from lookahead.proposers.shortlist import shortlist_head
from lookahead.verify import argmax, on_generator, warp


class DraftProposer:
    """Runs ``draft_model`` for ``num_draft_tokens`` tokens each step.

    The draft keeps its own KV cache of the committed text; after each step it keeps the
    entries of the drafted tokens the target accepted and drops the rest. When sampling, each
    draft token is drawn from the draft's warped distribution q, which the verifier needs for
    its ``min(1, p/q)`` rule. When greedy, the draft verifies prompt-lookup guesses in its own
    forward passes (see ``DraftConfig``), which yields the same tokens in fewer draft passes.

    With ``config.draft_vocab`` the draft runs its decoder, then its output layer for the
    first ``draft_vocab`` token ids and those of the text only
    (:class:`~lookahead.proposers.shortlist.ShortlistHead`); other ids get -inf.
    """

    def __init__(
        self,
        draft_model: torch.nn.Module,
        config: DraftConfig,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
    ) -> None:
        self.model = draft_model
        self.config = config
        self.sampling = sampling
        self.generator = generator
        self.cache = new_cache()
        self.cache_keyword = cache_keyword(draft_model)  # "cache" or "past_key_values"
        self.head = shortlist_head(draft_model, config.draft_vocab)
        self.decoder = draft_model.get_decoder() if self.head is not None else None
        self._cached = 0  # tokens of the committed text in the draft cache
        self._drafted = 0  # tokens drafted in the last step
        self.forwards = 0  # draft forward passes run, for statistics

    @classmethod
    def build(cls, config: DraftConfig, inputs: ProposerInputs) -> DraftProposer:
        """The proposer of ``method="draft"`` (``MethodSpec.proposer``)."""
        check_draft_model(inputs.model, inputs.draft_model)
        return cls(inputs.draft_model, config, inputs.sampling, inputs.generator)

    def start(self, prompt: list[int]) -> None:
        self.cache = new_cache()
        self._cached = 0
        if self.head is not None:
            self.head.reset()

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> Proposal:
        length = min(self.config.num_draft_tokens, max_tokens)
        self._drafted = max(length, 0)
        if length <= 0:
            return Proposal()
        feed = context[self._cached :]
        self._cached = len(context)
        if self.head is not None:
            # feed: the text the draft's cache lacks; the rest it drafted, from the list
            self.head.add(feed)
        if self.sampling.do_sample:
            tokens, probs = self._draft_sampled(feed, length)
            return Proposal([tokens], draft_probs=[probs])
        return Proposal([self._draft_greedy(context, feed, length)])

    def _forward(self, ids: list[int], rows: int) -> torch.Tensor:
        """Feed ``ids`` after the cache; logits [rows, V] of the last ``rows`` inputs."""
        self.forwards += 1
        tensor = torch.tensor([ids], dtype=torch.long, device=self.model.device)
        if self.head is None:
            out = decoding_pass(self.model, self.cache_keyword, self.cache, input_ids=tensor,
                                logits_to_keep=rows)
            return out.logits[0]
        out = decoding_pass(self.decoder, self.cache_keyword, self.cache, input_ids=tensor)
        return self.head(out.last_hidden_state[0, -rows:])

    def _draft_sampled(self, feed: list[int], length: int) -> tuple[list[int], torch.Tensor]:
        """``length`` tokens drawn one forward at a time, and q: [length, V] they came from."""
        tokens, probs = [], []
        for _ in range(length):
            q = on_generator(warp(self._forward(feed, 1)[-1], self.sampling), self.generator)
            token = int(torch.multinomial(q, 1, generator=self.generator))
            tokens.append(token)
            probs.append(q)
            feed = [token]
        return tokens, torch.stack(probs)

    def _draft_greedy(self, context: list[int], feed: list[int], length: int) -> list[int]:
        """The draft's greedy continuation of ``context``, ``length`` tokens long.

        Each pass feeds the pending tokens plus a guess copied from earlier text; the draft's
        own argmax keeps the guess's matching prefix and adds one token, so the result is
        plain greedy drafting. The cache keeps only the entries of tokens that were kept.
        """
        tokens: list[int] = []
        while len(tokens) < length:
            room = min(self.config.lookup_tokens, length - len(tokens) - 1)
            guess = find_continuation(context + tokens, self.config.lookup_ngram, 1, room) \
                if room > 0 else []
            before = cache_length(self.cache)
            preds = argmax(self._forward(feed + guess, len(guess) + 1)).tolist()
            hits = 0
            while hits < len(guess) and preds[hits] == guess[hits]:
                hits += 1
            keep_new(self.cache, before, list(range(len(feed) + hits)))
            tokens += preds[: hits + 1]
            feed = [tokens[-1]]
        return tokens[:length]

    def update(self, context: list[int], outcome: StepOutcome) -> None:
        if self._drafted == 0:
            return
        # The cache holds the text before this step, then at least the first drafted - 1
        # drafted tokens (the last one was never fed). Keep those the target accepted.
        valid = min(outcome.accepted, self._drafted - 1)
        keep_new(self.cache, self._cached, list(range(valid)))
        self._cached += valid


def check_draft_model(model, draft_model) -> None:
    """The draft must be a loaded model whose vocabulary is the target ``model``'s."""
    if not isinstance(draft_model, torch.nn.Module):
        raise TypeError(f"draft_model must be a loaded model for method 'draft', got {draft_model!r}")
    ours, theirs = vocab_size(model), vocab_size(draft_model)
    if ours != theirs:
        raise ValueError(
            f"draft_model must share the target's vocabulary: its vocab_size is {theirs}, "
            f"the target's is {ours}"
        )
