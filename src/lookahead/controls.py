"""Hugging Face logits processors and stopping criteria, applied inside speculative decoding.

``model.generate`` hands its processors the sequence so far and the next-token logits, one
position at a time. A speculative step verifies many positions in one forward pass, so
``Controls.scores`` rebuilds, for every node of the step's candidate tree, the sequence that
node continues (the accepted text, then the candidate tokens above it) and processes that
node's logits as if it were the next position: position j of a candidate sees exactly the
tokens before j. Greedy output with, say, a repetition penalty is then ``model.generate``'s
token for token, whichever candidates were proposed.

``Controls.stops`` asks the stopping criteria that ``Decoder`` does not handle itself (its
EOS ids and token limit do that) after every committed token, as ``model.generate`` does.

A row of a left-padded batch is decoded without its padding, but ``prefix`` (its padding)
is put back in front of what the processors and criteria see, so that lengths and ids
(``min_new_tokens``, the pad ids a penalty sees) are those ``model.generate`` gives them.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers.generation import logits_process as lp
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    StoppingCriteriaList,
)

from lookahead.penalties import PresenceFrequencyPenalty

# Processors that treat every row of a call on its own, keeping no state between calls: the
# rows of a tree at one depth go through them in one call. Any other processor is called once
# per tree node with a batch of one, as transformers' own assisted decoding calls it.
ROW_WISE = (
    lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor,
    lp.TemperatureLogitsWarper, lp.RepetitionPenaltyLogitsProcessor, lp.TopPLogitsWarper,
    lp.TopKLogitsWarper, lp.MinPLogitsWarper, lp.TypicalLogitsWarper, lp.EpsilonLogitsWarper,
    lp.EtaLogitsWarper, lp.NoRepeatNGramLogitsProcessor, lp.SequenceBiasLogitsProcessor,
    lp.ForcedBOSTokenLogitsProcessor, lp.ForcedEOSTokenLogitsProcessor,
    lp.InfNanRemoveLogitsProcessor, lp.ExponentialDecayLengthPenalty, lp.LogitNormalization,
    lp.SuppressTokensAtBeginLogitsProcessor, lp.SuppressTokensLogitsProcessor,
    PresenceFrequencyPenalty,
)

# Processors that run the model themselves or keep per-sequence state across calls: they
# cannot see a tree's positions in any order but one after another.
REFUSED = {
    lp.UnbatchedClassifierFreeGuidanceLogitsProcessor: "guidance_scale",
    lp.ClassifierFreeGuidanceLogitsProcessor: "guidance_scale",
}


def row_processors(processors: Sequence, row: int, batch: int) -> lp.LogitsProcessorList:
    """The processors of a ``batch``-row ``generate`` call as row ``row`` alone needs them.

    Per-row state that transformers keeps as a batch tensor (the padding a repetition penalty
    skips, an encoder penalty's prompt ids, the row index a prefix constraint is asked for) is
    cut down to that row; what cannot be is refused by name.
    """
    out = lp.LogitsProcessorList()
    for processor in processors:
        kind = type(processor)
        if kind in REFUSED:
            raise ValueError(f"{REFUSED[kind]} ({kind.__name__}) cannot be honoured by "
                             "speculative decoding: it runs the model itself, one token at a time")
        processor = copy.copy(processor)
        if isinstance(processor, lp.RepetitionPenaltyLogitsProcessor):
            skip = processor.prompt_ignore_length
            if isinstance(skip, torch.Tensor):
                processor.prompt_ignore_length = int(skip.reshape(-1)[row if skip.numel() > 1 else 0])
        elif isinstance(processor, lp.EncoderRepetitionPenaltyLogitsProcessor):
            processor.encoder_input_ids = processor.encoder_input_ids[row : row + 1]
        elif isinstance(processor, lp.PrefixConstrainedLogitsProcessor):
            allowed = processor._prefix_allowed_tokens_fn
            processor._prefix_allowed_tokens_fn = (
                lambda _batch_id, ids, row=row, allowed=allowed: allowed(row, ids))
        elif isinstance(processor, lp.EncoderNoRepeatNGramLogitsProcessor) and batch > 1:
            raise ValueError("encoder_no_repeat_ngram_size cannot be honoured for a batch of "
                             "several sequences; decode them one at a time")
        out.append(processor)
    return out


def split_criteria(criteria: Sequence) -> tuple[int | None, list[int] | None, StoppingCriteriaList]:
    """(max_length or None, EOS ids or None, the other criteria) of a criteria list: the first
    two ``Decoder`` applies itself, the others go to ``Controls``."""
    max_length, eos, others = None, None, StoppingCriteriaList()
    for criterion in criteria:
        if type(criterion) is MaxLengthCriteria:
            max_length = criterion.max_length if max_length is None else min(
                max_length, criterion.max_length)
        elif type(criterion) is EosTokenCriteria:
            eos = (eos or []) + [int(e) for e in criterion.eos_token_id.reshape(-1).tolist()]
        else:
            others.append(criterion)
    return max_length, eos, others


class Controls:
    """One sequence's logits processors and stopping criteria.

    prefix: ids in front of the decoded text that the processors and criteria see too (a
    batch row's left padding). processors: a ``LogitsProcessorList`` (may be empty).
    criteria: stopping criteria called after every committed token (may be empty).
    device: where the processors work (the input ids' device, as in ``model.generate``);
    None: the logits' device.
    """

    def __init__(self, processors: Sequence = (), criteria: Sequence = (),
                 prefix: Sequence[int] = (), device: torch.device | str | None = None) -> None:
        self.device = device
        self.processors = lp.LogitsProcessorList(processors)
        self.criteria = StoppingCriteriaList(criteria)
        self.prefix = [int(t) for t in prefix]
        self.row_wise = all(isinstance(p, ROW_WISE) for p in self.processors)
        self._ids = torch.zeros(0, dtype=torch.long)  # prefix + the text seen last, [L]

    def _text(self, context: list[int], device: torch.device) -> torch.Tensor:
        """prefix + context as LongTensor [L] on ``device``; only the new tokens are copied."""
        length = len(self.prefix) + len(context)
        known = self._ids.shape[0]
        if self._ids.device != device or known > length:
            self._ids, known = torch.zeros(0, dtype=torch.long, device=device), 0
        if known < length:
            full = self.prefix + context
            tail = torch.tensor(full[known:], dtype=torch.long, device=device)
            self._ids = torch.cat([self._ids, tail])
        return self._ids

    def scores(self, context: list[int], tree, logits: torch.Tensor) -> torch.Tensor:
        """Processed float32 scores [R, V] of ``logits`` [R, V], the rows of ``tree``'s nodes
        in order (``tree`` None: one row, the position right after ``context``)."""
        # The dtype and device model.generate processes in.
        scores = logits.to(dtype=torch.float32, device=self.device or logits.device, copy=True)
        if not self.processors:
            return scores
        text = self._text(context, scores.device)
        if tree is None:
            return self.processors(text.unsqueeze(0), scores)
        paths = _paths(tree)
        out = torch.empty_like(scores)
        for rows in _groups(tree, self.row_wise):
            tails = torch.tensor([paths[r] for r in rows], dtype=torch.long,
                                 device=scores.device).reshape(len(rows), -1)
            ids = torch.cat([text.unsqueeze(0).expand(len(rows), -1), tails], dim=1)
            index = torch.tensor(rows, device=scores.device)
            out[index] = self.processors(ids, scores[index])
        return out

    def stops(self, context: list[int], tail: list[int]) -> bool:
        """Whether a criterion ends the text ``context + tail`` (its last token just chosen)."""
        if not self.criteria:
            return False
        ids = torch.tensor([self.prefix + context + tail], dtype=torch.long)
        return bool(self.criteria(ids, None).any())


def _paths(tree) -> list[list[int]]:
    """For each tree node, the candidate tokens from below the root down to it (root: [])."""
    paths: list[list[int]] = [[]]
    for node in range(1, len(tree)):
        paths.append(paths[tree.parents[node]] + [tree.tokens[node]])
    return paths


def _groups(tree, row_wise: bool) -> list[list[int]]:
    """Tree nodes in calls: all of one depth together for row-wise processors, else one each."""
    if not row_wise:
        return [[node] for node in range(len(tree))]
    by_depth: dict[int, list[int]] = {}
    for node, depth in enumerate(tree.depths):
        by_depth.setdefault(depth, []).append(node)
    return list(by_depth.values())
