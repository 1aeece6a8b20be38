"""The decoder's commit (EOS and the token limit inside a proposal) and the budget trim."""


from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lookahead.attention import Branch, TokenTree
from lookahead.config import SamplingConfig
from lookahead.decode import Decoder, fit_budget
from lookahead.proposers.base import NoProposer, Proposal

pytestmark = pytest.mark.usefixtures("one_thread")


# --- the decoder's commit ------------------------------------------------------------------


def bare_decoder(max_new_tokens: int, eos=(9,)) -> Decoder:
    """A decoder whose model is never called (``_commit`` needs none); its config is empty."""
    return Decoder(
        SimpleNamespace(config=SimpleNamespace()),
        torch.tensor([[1, 2, 3]]),
        NoProposer(),
        max_new_tokens=max_new_tokens,
        sampling=SamplingConfig(),
        eos_token_ids=list(eos),
    )


def test_commit_stops_after_eos_inside_the_tokens():
    decoder = bare_decoder(10)
    assert decoder._commit([4, 5]) == [4, 5] and not decoder.finished
    assert decoder._commit([6, 9, 7, 8]) == [6, 9]
    assert decoder.finished
    assert decoder.context == [1, 2, 3, 4, 5, 6, 9]
    assert decoder.new_tokens == [4, 5, 6, 9] and decoder.stats.new_tokens == 4


def test_commit_stops_at_the_token_limit_inside_the_tokens():
    decoder = bare_decoder(5)
    decoder._commit([4, 5])
    assert decoder._commit([6, 7, 8, 10]) == [6, 7, 8]
    assert decoder.finished and decoder.stats.new_tokens == 5
    decoder = bare_decoder(3, eos=(8,))
    decoder._commit([4, 5])
    assert decoder._commit([8, 9]) == [8]  # EOS and limit on the same token
    assert decoder.finished and decoder.new_tokens == [4, 5, 8]


class OracleProposer:
    """Always proposes the next ``length`` tokens of a known continuation (always right)."""

    def __init__(self, future: list[int], prompt_len: int, length: int = 6) -> None:
        self.future, self.prompt_len, self.length = future, prompt_len, length

    def start(self, prompt):
        pass

    def propose(self, context, max_tokens):
        done = len(context) - self.prompt_len
        return Proposal([self.future[done : done + min(self.length, max_tokens)]])

    def update(self, context, outcome):
        pass


def test_decoder_eos_inside_an_always_right_proposal(tiny_lm):
    """With an oracle proposer every step accepts its whole proposal; an EOS in the middle of
    it must end the text there, as model.generate does."""
    model = tiny_lm("llama", seed=0)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        full = model.generate(ids, do_sample=False, max_new_tokens=20)[0, 8:].tolist()
    # The EOS: a token first generated at position 3..6, inside the second step's proposal
    # full[1:7] (the prefill commits full[0]), followed by accepted tokens and the bonus.
    first = {}
    for pos, tok in enumerate(full):
        first.setdefault(tok, pos)
    eos, cut = min(((p, t) for t, p in first.items() if 3 <= p <= 6), default=(None, None))[::-1]
    assert eos is not None
    decoder = Decoder(
        model,
        ids,
        OracleProposer(full, 8),
        max_new_tokens=20,
        sampling=SamplingConfig(),
        eos_token_ids=[eos],
    )
    steps = list(decoder)
    assert decoder.new_tokens == full[: cut + 1]
    assert steps[0] == full[:1] and len(steps) == 2  # prefill, then one step up to the EOS
    assert decoder.finished


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 7, 9])
def test_decoder_token_limit_inside_an_always_right_proposal(tiny_lm, limit):
    model = tiny_lm("llama", seed=0)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        full = model.generate(ids, do_sample=False, max_new_tokens=20)[0, 8:].tolist()
    decoder = Decoder(
        model,
        ids,
        OracleProposer(full, 8, length=5),
        max_new_tokens=limit,
        sampling=SamplingConfig(),
        eos_token_ids=[],
    )
    steps = list(decoder)
    assert decoder.new_tokens == full[:limit]
    assert sum(map(len, steps)) == limit
    assert all(p <= max(limit - 1, 0) for p in decoder.stats.proposed_per_step)


# --- fit_budget ----------------------------------------------------------------------------


def a_branch(size: int) -> Branch:
    return Branch(
        tokens=torch.arange(size) + 50,
        depths=torch.arange(size) + 1,
        visible=torch.eye(size, dtype=torch.bool),
        logit_rows=torch.arange(size),
    )


def test_fit_budget_keeps_candidates_while_their_trie_fits():
    proposal = Proposal([[1, 2, 3], [1, 4], [5]])
    assert fit_budget(proposal, None) is proposal
    assert fit_budget(proposal, 4).candidates == [[1, 2, 3]]  # 1 + 3 tokens
    assert fit_budget(proposal, 5).candidates == [[1, 2, 3], [1, 4]]  # the trie shares "1"
    assert fit_budget(proposal, 6).candidates == [[1, 2, 3], [1, 4], [5]]
    assert fit_budget(proposal, 100).candidates == proposal.candidates
    assert fit_budget(Proposal([[1, 2], [1, 2, 3]]), 4).candidates == [[1, 2], [1, 2, 3]]
    assert fit_budget(proposal, 3).candidates == [[1, 2]]  # a single chain cut short
    assert fit_budget(proposal, 1).candidates == []


def test_fit_budget_drops_the_branch_first_and_trims_draft_probs():
    branch = a_branch(4)
    proposal = Proposal([[1, 2, 3]], branch=branch)
    fitted = fit_budget(proposal, 4)  # x0 + 4 branch tokens do not fit: no branch
    assert fitted.branch is None and fitted.candidates == [[1, 2, 3]]
    fitted = fit_budget(proposal, 5)  # they fit, but leave no room to verify anything
    assert fitted.branch is None and fitted.candidates == [[1, 2, 3]]
    fitted = fit_budget(Proposal([], branch=branch), 5)  # nothing to verify: the branch stays
    assert fitted.branch is branch and fitted.candidates == []
    fitted = fit_budget(proposal, 6)  # room for one candidate token beside the branch
    assert fitted.branch is branch and fitted.candidates == [[1]]
    fitted = fit_budget(proposal, 7)  # x0 + 4 + 2: the branch stays, the candidate is cut
    assert fitted.branch is branch and fitted.candidates == [[1, 2]]
    fitted = fit_budget(proposal, 8)
    assert fitted.branch is branch and fitted.candidates == [[1, 2, 3]]
    probs = torch.rand(3, 10)
    fitted = fit_budget(Proposal([[1, 2, 3]], draft_probs=[probs]), 3)
    assert fitted.candidates == [[1, 2]]
    assert len(fitted.draft_probs) == 1 and torch.equal(fitted.draft_probs[0], probs[:2])
    for budget in range(1, 9):  # whatever the budget, the step fits in it
        fitted = fit_budget(Proposal([[1, 2, 3], [1, 4], [6, 7]], branch=branch), budget)
        size = 1 + (0 if fitted.branch is None else 4) + len(TokenTree(0, fitted.candidates)) - 1
        assert size <= budget


@pytest.mark.parametrize("method", ["lookahead", "draft"])
def test_every_decoding_forward_runs_in_decoding_attention(tiny_lm, monkeypatch, method) -> None:
    """The prefill, each step and each draft pass enter ``decoding_attention``."""
    import contextlib

    import lookahead.cache
    import lookahead.request

    entered = []

    @contextlib.contextmanager
    def recording(device):
        entered.append(device.type)
        yield

    monkeypatch.setattr(lookahead.cache, "decoding_attention", recording)
    model = tiny_lm("llama")
    options = dict(draft_model=tiny_lm("llama", seed=1)) if method == "draft" else {}
    decoder = lookahead.request.make_decoder(model, torch.tensor([[3, 4, 5, 3, 4]]), 12, method,
                                         **options)
    list(decoder)
    draft_passes = decoder.proposer.forwards if method == "draft" else 0
    assert entered == ["cpu"] * (decoder.stats.steps + draft_passes)
