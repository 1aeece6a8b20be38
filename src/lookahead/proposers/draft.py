"""Draft-model speculative decoding: a small model with the same vocabulary proposes tokens."""

from __future__ import annotations

import torch

from lookahead.cache import keep_new, new_cache
from lookahead.config import DraftConfig, SamplingConfig
from lookahead.proposers.base import Proposal, StepOutcome
from lookahead.verify import argmax, warp


class DraftProposer:
    """Runs ``draft_model`` autoregressively for ``num_draft_tokens`` tokens each step.

    The draft keeps its own KV cache of the committed text; after each step it keeps the
    entries of the drafted tokens the target accepted and drops the rest. When sampling, each
    draft token is drawn from the draft's warped distribution q, which the verifier needs for
    its ``min(1, p/q)`` rule.
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
        self._cached = 0  # tokens of the committed text in the draft cache
        self._drafted = 0  # tokens drafted in the last step

    def start(self, prompt: list[int]) -> None:
        self.cache = new_cache()
        self._cached = 0

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> Proposal:
        length = min(self.config.num_draft_tokens, max_tokens)
        self._drafted = max(length, 0)
        if length <= 0:
            return Proposal()
        feed = context[self._cached :]
        self._cached = len(context)
        tokens, probs = [], []
        for _ in range(length):
            ids = torch.tensor([feed], dtype=torch.long, device=self.model.device)
            logits = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                                logits_to_keep=1).logits[0, -1]
            if self.sampling.do_sample:
                q = warp(logits, self.sampling).cpu()  # the generator is a CPU one
                token = int(torch.multinomial(q, 1, generator=self.generator))
                probs.append(q)
            else:
                token = int(argmax(logits))
            tokens.append(token)
            feed = [token]
        draft_probs = [torch.stack(probs)] if probs else None
        return Proposal([tokens], draft_probs=draft_probs)

    def update(self, context: list[int], outcome: StepOutcome) -> None:
        if self._drafted == 0:
            return
        # The cache holds the text before this step, then the first drafted - 1 drafted
        # tokens (the last one was never fed). Keep those the target accepted.
        valid = min(outcome.accepted, self._drafted - 1)
        keep_new(self.cache, self._cached, list(range(valid)))
        self._cached += valid
