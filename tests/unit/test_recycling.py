"""Token Recycling: the successor table and the candidates the lookahead proposer reads off it."""

from __future__ import annotations

import pytest
import torch

from lookahead.attention import TokenTree
from lookahead.config import LookaheadConfig
from lookahead.proposers.base import StepOutcome
from lookahead.proposers.lookahead import LookaheadProposer
from lookahead.proposers.recycling import SuccessorTable

pytestmark = pytest.mark.usefixtures("one_thread")


def scores_ranking(vocab: int, *rankings: list[int]) -> torch.Tensor:
    """Scores [len(rankings), vocab] whose rows rank the given tokens first, in order."""
    scores = torch.zeros(len(rankings), vocab)
    for row, ranking in enumerate(rankings):
        for rank, token in enumerate(ranking):
            scores[row, token] = 10.0 - rank
    return scores


def test_table_keeps_the_top_k_of_each_row_and_the_latest_row_wins():
    table = SuccessorTable(k=3)
    table.record([5, 6], scores_ranking(20, [7, 8, 9, 10], [1, 2, 3]))
    assert table.successors(5) == [7, 8, 9]
    assert table.successors(6) == [1, 2, 3]
    assert table.successors(4) == []
    table.record([5], scores_ranking(20, [11, 12, 13]))
    assert table.successors(5) == [11, 12, 13] and len(table) == 2


def test_chains_follow_the_top_successor_then_branch_once():
    table = SuccessorTable(k=4)
    # 1 -> 2 -> 3 -> 4, with alternatives 9 after 1 and 8 after 2
    table.record([1, 2, 3, 9, 8], scores_ranking(20, [2, 9, 7], [3, 8], [4], [5], [6]))
    chains = table.chains(1, depth=3, branches=(3, 2))
    assert chains == [
        ([2, 3, 4], "recycled"),
        ([9, 5], "recycled@1.1"),  # 9's top successor is 5; 5 has none
        ([7], "recycled@1.2"),
        ([2, 8, 6], "recycled@2.1"),
    ]
    assert table.chains(1, depth=1, branches=(1,)) == [([2], "recycled")]
    assert table.chains(13, depth=3, branches=(3, 2)) == []


def test_a_pair_of_tokens_predicts_where_it_was_seen_else_the_last_token_alone():
    table = SuccessorTable(k=2, pair_capacity=4)
    table.record([5, 5], scores_ranking(20, [7, 8], [9, 10]), before=[1, 2])
    assert table.successors(5, before=1) == [7, 8]
    assert table.successors(5, before=2) == [9, 10]
    assert table.successors(5, before=3) == [9, 10]  # the latest row of 5 alone
    assert table.successors(5) == [9, 10]
    # chains follow the pairs along the way: after (1, 5) comes 7, after (5, 7) comes 11
    table.record([7, 7], scores_ranking(20, [11, 12], [13, 14]), before=[5, 6])
    assert table.chains(5, depth=2, branches=(), before=1)[0] == ([7, 11], "recycled")
    assert table.chains(5, depth=2, branches=(), before=2)[0] == ([9], "recycled")
    # beyond the capacity the pair written longest ago goes
    table.record([8], scores_ranking(20, [1, 2]), before=[3])
    assert (1, 5) not in table._pairs and len(table._pairs) == 4


def test_table_rejects_a_bad_k():
    with pytest.raises(ValueError, match="k must be a positive int"):
        SuccessorTable(k=0)


def test_lookahead_proposes_what_the_model_predicted_after_x0_last_time():
    """A step's tree rows fill the table; the next time x0 comes up, its recorded top chain is
    a candidate (with no copy or n-gram that could offer it)."""
    config = LookaheadConfig(window=1, ngram=2, guess=1, lookup_ngram=0, prompt_pool=False,
                             output_pool=False, trim_candidates=False, recycle=2,
                             recycle_depth=2)
    proposer = LookaheadProposer(config)
    proposer.start([1, 2, 3])
    proposer.propose([1, 2, 3], max_tokens=4)
    tree = TokenTree(3, [[40, 41]])
    scores = scores_ranking(64, [50, 51], [52], [53])
    proposer.update([1, 2, 3, 50], StepOutcome(committed=[50], accepted=0, tree=tree,
                                              tree_scores=scores))
    # keyed by the node's token, and by its parent's (for x0: the text's token before it)
    assert proposer.successors._pairs[(2, 3)][0] == 50
    assert proposer.successors._pairs[(40, 41)][0] == 53
    assert proposer.successors.successors(40)[0] == 52
    candidates = proposer.propose([1, 2, 3, 50, 9, 3], max_tokens=4).candidates
    assert any(c[:1] == [50] for c in candidates)
    assert LookaheadProposer(LookaheadConfig()).successors.k == 8  # on by default
    assert LookaheadProposer(LookaheadConfig(recycle=0)).successors is None


def test_a_shared_table_carries_the_models_predictions_across_requests(tiny_lm):
    """``successors=`` keeps one table across calls: the second request starts with the rows
    the first left, and both texts stay the model's own greedy ones."""
    from lookahead import SuccessorTable, generate
    from tests.tiny import reference

    model = tiny_lm("llama", seed=0)
    table = SuccessorTable(k=4)
    first = torch.tensor([[3, 7, 11, 5, 9, 2]])
    second = torch.tensor([[4, 8, 6, 3, 7]])
    out = generate(model, first, max_new_tokens=12, successors=table, recycle=4)
    assert out.sequences.tolist() == reference(model, first, 12).tolist()
    rows = len(table)
    assert rows > 0
    out = generate(model, second, max_new_tokens=12, successors=table, recycle=4)
    assert out.sequences.tolist() == reference(model, second, 12).tolist()
    assert len(table) >= rows
    with pytest.raises(TypeError, match="successors must be a lookahead.SuccessorTable"):
        generate(model, first, max_new_tokens=2, successors={})
    with pytest.raises(TypeError, match="unknown option"):
        generate(model, first, max_new_tokens=2, method="prompt_lookup", successors=table)


def test_recycled_chains_start_from_their_measured_rates_where_priced():
    """Priced on step costs, a recycled chain's depths start below a text copy's (a branch
    lower still); unpriced, every depth is tried at first."""
    from lookahead.proposers.gauges import SOURCE_PRIORS, DepthGauge

    priced = DepthGauge(0.1, step_costs=(1.0, 1.0, 1.0, 1.0))
    assert priced.prior_of("recycled") == SOURCE_PRIORS["recycled"][0] < priced.prior_of("text")
    assert priced.prior_of("recycled@2.1") == SOURCE_PRIORS["recycled@"][0]
    assert priced.prior_of("recycled@2.1") < priced.prior_of("recycled")
    # fed while the expected gain beats the cost: where a second token costs 1.3x, a text
    # copy (0.6) goes in, a recycled branch (a tenth) does not
    steep = DepthGauge(0.1, step_costs=(1.0, 1.3))
    assert steep.priced_depths([([5], "text")]) == [1]
    assert steep.priced_depths([([7], "recycled@1.1")]) == [0]
    unpriced = DepthGauge(0.1)
    assert unpriced.prior_of("recycled@1.1") == unpriced.prior_of("text") == 1.0
