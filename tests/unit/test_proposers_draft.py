"""The draft proposer."""

from __future__ import annotations

import pytest

from lookahead.config import DraftConfig, SamplingConfig
from lookahead.proposers.base import StepOutcome
from lookahead.proposers.draft import DraftProposer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_greedy_draft_with_lookup_drafts_the_same_tokens_in_fewer_passes(tiny_lm):
    """Prompt lookup inside the draft model changes how many draft passes run, not the draft:
    over several steps (the target taking part of each draft, then its own token) the drafts
    equal those of plain one-token-per-pass drafting, so the draft cache stays right too."""
    draft = tiny_lm("llama", seed=1)
    context = [3, 1, 4, 1, 5, 9, 2, 6] * 3
    plain, fast = (
        DraftProposer(draft, DraftConfig(num_draft_tokens=12, lookup_tokens=tokens),
                      SamplingConfig(), None)
        for tokens in (0, 8)
    )
    for proposer in (plain, fast):
        proposer.start(context)
    for accepted in (6, 0, 12, 3):
        drafts = [p.propose(context, 12).candidates[0] for p in (plain, fast)]
        assert drafts[0] == drafts[1] and len(drafts[0]) == 12
        committed = drafts[0][:accepted] + ([7] if accepted < 12 else [])
        context = context + committed
        for proposer in (plain, fast):
            proposer.update(context, StepOutcome(committed, accepted))
    assert plain.forwards == 4 * 12
    assert fast.forwards < plain.forwards
