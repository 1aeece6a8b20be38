"""The interface every proposer implements: propose candidates, then observe the outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from lookahead.attention import Branch, TokenTree


@dataclass(frozen=True)
class Proposal:
    """What a proposer offers for one step.

    candidates: continuations of the text after ``x0`` (the last token), each a token list.
    draft_probs: for draft models, ``draft_probs[i]`` is [len(candidates[i]), V], the
        distribution each token of candidate i was drawn from; None for deterministic proposals.
    branch: extra tokens to run in the same forward pass (the lookahead window), or None.
    """

    candidates: list[list[int]] = field(default_factory=list)
    draft_probs: list[torch.Tensor] | None = None
    branch: Branch | None = None


@dataclass(frozen=True)
class StepOutcome:
    """What the step decided, handed back to the proposer.

    committed: tokens appended to the text this step (accepted, then bonus or recovered).
    accepted: how many of them were proposed tokens.
    branch_logits: [R, V] logits of the branch rows the proposal asked for, or None.
    forward_tokens, seconds: the tokens the step's forward pass was fed and how long it took,
        where the pass was this request's alone (else None: a server's shared pass).
    tree, tree_scores: the step's candidate tree (``lookahead.attention.TokenTree``, x0 its
        root) and the scores [len(tree), V] the model gave the position after each node,
        accepted or not (Token Recycling reads them).
    """

    committed: list[int]
    accepted: int
    branch_logits: torch.Tensor | None = None
    forward_tokens: int | None = None
    seconds: float | None = None
    tree: TokenTree | None = None
    tree_scores: torch.Tensor | None = None


@dataclass(frozen=True)
class ProposerInputs:
    """What a method's proposer may be built from besides its config
    (``lookahead.config.MethodSpec.proposer`` is called with ``(config, inputs)``).

    model: the target; sampling: a ``lookahead.config.SamplingConfig``; generator: the
    request's RNG (sampling only); memory, datastore: texts to copy from (copying methods);
    draft_model: the draft (``needs_draft`` methods); successors: a successor table shared
        across requests (``recycles`` methods; None: each request starts its own).
    """

    model: torch.nn.Module
    sampling: object
    generator: torch.Generator | None = None
    memory: object | None = None
    datastore: object | None = None
    draft_model: object | None = None
    successors: object | None = None


def vocab_size(model) -> int:
    """The size of ``model``'s vocabulary (of its text part, for a multimodal config)."""
    config = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    return int(config.vocab_size)


class Proposer(Protocol):
    """A strategy that guesses the next tokens; one instance per request (it holds state)."""

    def start(self, prompt: list[int]) -> None:
        """Reset for a new text whose prompt is ``prompt``."""

    def propose(self, context: list[int], max_tokens: int) -> Proposal:
        """Candidates following ``context[-1]`` (x0), each at most ``max_tokens`` long; at
        ``max_tokens <= 0`` the step feeds x0 alone and nothing need be proposed."""

    def update(self, context: list[int], outcome: StepOutcome) -> None:
        """Learn from the step; ``context`` already ends with ``outcome.committed``."""


class NoProposer:
    """Plain one-token-per-step decoding: proposes nothing."""

    @classmethod
    def build(cls, config: None = None, inputs: ProposerInputs | None = None) -> NoProposer:
        return cls()

    def start(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int], max_tokens: int) -> Proposal:
        return Proposal()

    def update(self, context: list[int], outcome: StepOutcome) -> None:
        pass
