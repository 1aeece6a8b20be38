"""Unit tests of the pure parts, on hand-written arrays.

TokenTree, the step layout and its masks, the lookahead window's visibility, the n-gram pool,
prompt-lookup matching, the cache's keep operation, the greedy and sampling accept rules, the
decoder's commit (EOS inside a proposal, token limit inside a proposal), the budget trim and
the statistics.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

import lookahead
from lookahead.attention import Branch, TokenTree, attention_mask, layout_step
from lookahead.cache import GrowingLayer, cache_keyword, cache_length, keep_new, new_cache
from lookahead.config import DraftConfig, LookaheadConfig, PromptLookupConfig, SamplingConfig
from lookahead.decode import Decoder, fit_budget
from lookahead.proposers.base import NoProposer, Proposal, StepOutcome
from lookahead.proposers.draft import DraftProposer
from lookahead.proposers.lookahead import (
    DepthGauge,
    LookaheadProposer,
    NGramPool,
    WindowGauge,
    window_visibility,
)
from lookahead.proposers.prompt_lookup import CopyLength, PromptLookupProposer, find_continuation
from lookahead.server.shapes import prefill_length, prefill_lengths
from lookahead.stats import GenerationStats
from lookahead.verify import verify_greedy, verify_sampling

pytestmark = pytest.mark.usefixtures("one_thread")

# --- TokenTree -----------------------------------------------------------------------------


def test_token_tree_shares_prefixes():
    tree = TokenTree(9, [[5, 6, 7], [5, 8]])
    assert tree.tokens == [9, 5, 6, 7, 8]
    assert tree.parents == [-1, 0, 1, 2, 1]
    assert tree.depths == [0, 1, 2, 3, 2]
    assert tree.children == [{5: 1}, {6: 2, 8: 4}, {7: 3}, {}, {}]
    assert tree.source == [(-1, -1), (0, 0), (0, 1), (0, 2), (1, 1)]
    assert len(tree) == 5 and not tree.is_chain()
    expected = np.array(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 0, 0, 1],
        ],
        dtype=bool,
    )
    assert np.array_equal(tree.ancestors(), expected)


def test_token_tree_duplicates_and_prefixes_add_no_nodes():
    tree = TokenTree(0, [[1, 2], [1, 2], [1], [1, 2, 3]])
    assert tree.tokens == [0, 1, 2, 3]
    assert tree.parents == [-1, 0, 1, 2]
    assert tree.is_chain()
    assert tree.source[3] == (3, 2)  # the first candidate that created the node
    assert len(TokenTree(4)) == 1 and TokenTree(4).is_chain()


@settings(max_examples=60, deadline=None, database=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5), max_size=6))
def test_token_tree_properties(candidates):
    tree = TokenTree(99, candidates)
    prefixes = {tuple(c[:k]) for c in candidates for k in range(1, len(c) + 1)}
    assert len(tree) == 1 + len(prefixes)
    anc = tree.ancestors()
    for node in range(len(tree)):
        # Walking up the parents gives the node's root path; ancestors() marks exactly it.
        path, cur = [], node
        while cur != -1:
            path.append(cur)
            cur = tree.parents[cur]
        assert set(np.flatnonzero(anc[node])) == set(path)
        assert tree.depths[node] == len(path) - 1
    for index, cand in enumerate(candidates):
        node = 0
        for offset, token in enumerate(cand):  # every candidate is a root path
            node = tree.children[node][token]
            assert tree.tokens[node] == token
            ci, co = tree.source[node]
            assert ci <= index and candidates[ci][: co + 1] == cand[: offset + 1]


# --- layout_step and attention_mask ----------------------------------------------------------


def step_rows(layout, tree: TokenTree) -> tuple[list[int], list[int]]:
    """(row of each tree node, row of each branch token) in the step's input.

    The order of the two groups inside the step is the layout's choice; x0 is tree node 0.
    """
    if hasattr(layout, "tree_rows"):
        tree_rows = layout.tree_rows.tolist()
    else:  # the tree first, node i at row i
        tree_rows = list(range(layout.tree_size))
    taken = set(tree_rows)
    branch_rows = [r for r in range(layout.input_ids.shape[1]) if r not in taken]
    return tree_rows, branch_rows


def test_layout_chain_without_branch_lets_the_model_mask():
    tree = TokenTree(3, [[4, 5]])
    layout = layout_step(tree, None, position=10)
    assert layout.visible is None
    assert layout.input_ids.tolist() == [[3, 4, 5]]
    assert layout.position_ids.tolist() == [[10, 11, 12]]
    assert step_rows(layout, tree) == ([0, 1, 2], [])
    assert layout.logit_rows.tolist() == [0, 1, 2]


def test_layout_tree_without_branch():
    tree = TokenTree(9, [[5, 6, 7], [5, 8]])
    layout = layout_step(tree, None, position=10)
    rows, branch_rows = step_rows(layout, tree)
    assert branch_rows == [] and sorted(rows) == [0, 1, 2, 3, 4] and rows[0] == 0
    assert [layout.input_ids[0, r].item() for r in rows] == [9, 5, 6, 7, 8]
    assert [layout.position_ids[0, r].item() for r in rows] == [10, 11, 12, 13, 12]
    assert layout.logit_rows.tolist() == rows
    visible = layout.visible[rows][:, rows]  # in node order
    assert visible.tolist() == tree.ancestors().tolist()


def test_layout_with_branch():
    branch = Branch(
        tokens=torch.tensor([20, 21, 22]),
        depths=torch.tensor([1, 2, 2]),
        visible=torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool),
        logit_rows=torch.tensor([1, 2]),
    )
    tree = TokenTree(9, [[5, 6], [7]])  # nodes: x0, 5, 6, 7
    layout = layout_step(tree, branch, position=4)
    rows, branch_rows = step_rows(layout, tree)
    assert len(rows) == 4 and len(branch_rows) == 3 and rows[0] == 0
    order = rows + branch_rows  # x0, 5, 6, 7, 20, 21, 22
    assert [layout.input_ids[0, r].item() for r in order] == [9, 5, 6, 7, 20, 21, 22]
    assert [layout.position_ids[0, r].item() for r in order] == [4, 5, 6, 5, 5, 6, 6]
    # Logits: every tree node, then the branch tokens it asked for (21 and 22).
    assert layout.logit_rows.tolist() == rows + [branch_rows[1], branch_rows[2]]
    expected = [
        # x0  5  6  7 20 21 22
        [1, 0, 0, 0, 0, 0, 0],  # x0
        [1, 1, 0, 0, 0, 0, 0],  # 5
        [1, 1, 1, 0, 0, 0, 0],  # 6
        [1, 0, 0, 1, 0, 0, 0],  # 7
        [1, 0, 0, 0, 1, 0, 0],  # 20
        [1, 0, 0, 0, 1, 1, 0],  # 21
        [1, 0, 0, 0, 0, 0, 1],  # 22
    ]
    assert layout.visible[order][:, order].int().tolist() == expected


def test_attention_mask_full_and_sliding():
    visible = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    positions = torch.tensor([[5, 6, 6]])
    low = torch.finfo(torch.float64).min
    mask = attention_mask(SimpleNamespace(), visible, 5, positions, torch.float64)
    assert mask.shape == (1, 1, 3, 8) and mask.dtype == torch.float64
    allowed = torch.zeros(3, 8, dtype=torch.bool)
    allowed[:, :5] = True
    allowed[:, 5:] = visible
    assert torch.equal(mask[0, 0] == 0, allowed)
    assert torch.all(mask[0, 0][~allowed] == low)
    # A window of 3 positions: position 6 sees keys at 4, 5, 6 only; position 5 sees 3, 4, 5.
    windowed = attention_mask(
        SimpleNamespace(sliding_window=3), visible, 5, positions, torch.float64
    )
    expected = allowed.clone()
    expected[0, :3] = False
    expected[1:, :4] = False
    assert torch.equal(windowed[0, 0] == 0, expected)
    # Models that name their layer types get one mask per type.
    both = attention_mask(
        SimpleNamespace(sliding_window=3, layer_types=["sliding_attention", "full_attention"]),
        visible,
        5,
        positions,
        torch.float64,
    )
    assert set(both) == {"full_attention", "sliding_attention"}
    assert torch.equal(both["full_attention"], mask)
    assert torch.equal(both["sliding_attention"], windowed)
    only_full = attention_mask(
        SimpleNamespace(sliding_window=3, layer_types=["full_attention"]),
        visible,
        5,
        positions,
        torch.float64,
    )
    assert torch.equal(only_full, mask)


# --- the lookahead window ------------------------------------------------------------------


def test_window_visibility_follows_the_rule():
    levels, window = 3, 4
    vis = window_visibility(levels, window)
    assert vis.shape == (12, 12) and vis.dtype == torch.bool
    for row in range(12):
        level, col = divmod(row, window)
        for key in range(12):
            k_level, k_col = divmod(key, window)
            # Module docstring: level 0 is causal along its columns; level l >= 1, column j
            # sees level 0 up to column j and levels 1..l of column j.
            rule = (k_level == 0 and k_col <= col) or (1 <= k_level <= level and k_col == col)
            assert bool(vis[row, key]) == rule, (level, col, k_level, k_col)
    # Hand-picked cells: (2, 1) sees (0, 0), (0, 1), (1, 1), (2, 1), nothing else.
    row = 2 * window + 1
    assert sorted(torch.nonzero(vis[row]).flatten().tolist()) == [0, 1, window + 1, 2 * window + 1]


@pytest.mark.parametrize("levels, window", [(1, 1), (1, 5), (2, 3), (3, 4), (4, 2)])
def test_window_token_sees_one_token_per_earlier_position(levels, window):
    """Depth of (l, j) is l + j + 1; it must see exactly one token at each depth 1..l+j+1."""
    vis = window_visibility(levels, window)
    depth = [level + col + 1 for level in range(levels) for col in range(window)]
    for row in range(levels * window):
        seen = sorted(depth[k] for k in torch.nonzero(vis[row]).flatten().tolist())
        assert seen == list(range(1, depth[row] + 1))


# --- the n-gram pool -----------------------------------------------------------------------


def test_ngram_pool_docstring_example():
    pool = NGramPool(3, capacity=7)
    pool.add_all([1, 2, 3, 1, 2, 4])
    assert pool.get(1) == [[2, 4], [2, 3]]
    assert pool.get(2) == [[3, 1]]
    assert pool.get(3) == [[1, 2]]
    assert pool.get(4) == []
    assert len(pool) == 4


def test_ngram_pool_lru_and_capacity_per_key():
    pool = NGramPool(3, capacity=2)
    pool.add([1, 2, 3])
    pool.add([1, 4, 5])
    pool.add([1, 2, 3])  # refreshed: now the most recent
    pool.add([1, 6, 7])  # evicts the least recent, [4, 5]
    assert pool.get(1) == [[6, 7], [2, 3]]
    pool.add([8, 9, 9])  # other keys have their own capacity
    pool.add([8, 9, 8])
    assert pool.get(8) == [[9, 8], [9, 9]]
    assert pool.get(1) == [[6, 7], [2, 3]]
    assert len(pool) == 4


def test_ngram_pool_add_all_from_start():
    pool = NGramPool(3, capacity=5)
    pool.add_all([1, 2, 3, 4, 5], start=2)
    assert pool.get(1) == [] and pool.get(2) == []
    assert pool.get(3) == [[4, 5]]
    pool.add_all([7, 8, 9], start=-4)  # a negative start means from the beginning
    assert pool.get(7) == [[8, 9]]
    pool.add_all([6, 6, 6, 6], start=3)  # no n-gram starts at 3 or later
    assert pool.get(6) == []
    pool.add_all([5, 5])  # shorter than n
    assert pool.get(5) == []


def test_ngram_pool_marks_the_windows_guesses_until_the_text_has_them():
    pool = NGramPool(3, capacity=4)
    pool.add([1, 2, 3], guessed=True)
    pool.add([1, 5, 6], guessed=True)
    pool.add_all([0, 1, 2, 3])  # the text confirms 1 2 3
    pool.add([1, 2, 3], guessed=True)  # guessed again: still the text's
    assert pool.entries(1) == [([2, 3], False), ([5, 6], True)]
    assert pool.get(1) == [[2, 3], [5, 6]]


def test_window_gauge_gain_is_what_the_windows_candidates_add():
    gauge = WindowGauge(token_cost=0.0, probe=100, warm_up=0)
    # The text's candidate reaches 2 tokens of what was committed, the window's 3.
    gauge.record([[1, 2, 3], [1, 2, 9, 9]], [True, False], committed=[1, 2, 9, 5])
    assert (gauge.gain, gauge.committed) == (1.0, 4.0)
    gauge.record([[1, 2, 9]], [True], committed=[1, 2, 9, 5])  # the text's own: no gain
    gauge.record([], [], committed=[7])
    assert gauge.gain == pytest.approx(1 / 3) and gauge.committed == pytest.approx(3.0)


def test_window_gauge_runs_the_window_only_while_it_pays():
    free = WindowGauge(token_cost=0.0, probe=100, warm_up=0)
    free.record([], [], committed=[1])
    assert all(free.wants_window(64, 10) for _ in range(20))  # free tokens: always
    dear = WindowGauge(token_cost=0.05, probe=4, warm_up=2)
    decisions = []
    for _ in range(8):
        decisions.append(dear.wants_window(window_tokens=8, other_tokens=9))
        dear.record([[5, 6]], [True], committed=[5, 6, 7])  # the window adds nothing
    assert decisions == [True, True, False, True, False, False, False, True]  # warm-up, probes
    # g (1 + k t) >= k b s: 0.4 x 1.45 = 0.58 >= 0.05 x 8 x 3.4 = 1.36 fails, 1.0 x 1.45 passes.
    for gain, pays in ((0.4, False), (1.0, True)):
        dear.gain, dear.committed, dear.steps = gain, 3.4, 9
        assert dear.wants_window(window_tokens=8, other_tokens=9) is pays, gain


def test_depth_gauge_learns_what_the_text_tells_and_no_more():
    gauge = DepthGauge(token_cost=0.0)
    # A mismatch at depth 3: hits at 1-2, misses at 3-5 (the rest of the candidate).
    gauge.record([([1, 2, 8, 8, 8], "text")], fed=5, committed=[1, 2, 3])
    # A match as long as what was committed: depths 1-2 hit; past them the text does not tell.
    gauge.record([([1, 2, 3, 4], "pool")], fed=4, committed=[1, 2])
    assert gauge._rates["text"] == [[1.0, 2], [1.0, 2], [0.5, 2], [0.5, 2], [0.5, 2]]
    assert gauge._rates["pool"] == [[1.0, 2], [1.0, 2]]
    assert gauge.depth("text", 5) == 5 and gauge.depth("datastore", 7) == 7  # free tokens


def test_depth_gauge_cuts_a_source_where_it_stops_paying_and_lets_it_back():
    gauge = DepthGauge(token_cost=0.1)
    for _ in range(20):  # copies right for 2 tokens, wrong after; pool n-grams right for 3
        gauge.record([([1, 2, 9, 9, 9, 9], "datastore"), ([1, 2, 3], "pool")], fed=9,
                     committed=[1, 2, 3, 4])
    # bar = k s / (1 + k t) = 0.1 x 4 / 1.9: depth 3 of the datastore's copies falls short.
    assert gauge.depth("datastore", 6) == 2
    assert gauge.depth("pool", 3) == 3 and gauge.depth("text", 8) == 8  # untried: whole
    for _ in range(20):  # the copies come right: the committed tokens show depths 3-5 hit
        gauge.record([([1, 2, 3, 4, 5, 9], "datastore")], fed=3, committed=[1, 2, 3, 4, 5, 6])
    assert gauge.depth("datastore", 6) == 5


def test_lookahead_feeds_each_candidate_to_the_depth_that_pays():
    text = [5, 6, 7, 1, 2, 3, 4, 8, 5, 6, 7]  # "5 6 7" was followed by "1 2 3 4 8 5 ..."
    fed = {}
    for trim in (True, False):
        config = LookaheadConfig(window=1, ngram=3, guess=1, lookup_tokens=6, token_cost=0.2,
                                 trim_candidates=trim, window_probe=1 << 20)
        proposer = LookaheadProposer(config)
        proposer.start(text)
        for step in range(12):  # the copy's first 2 tokens are right, the rest never
            proposal = proposer.propose(text, max_tokens=8)
            proposer.update(text, StepOutcome([1, 2, 9], 2, None))
        fed[trim] = max(proposal.candidates, key=len)
    assert fed == {False: [1, 2, 3, 4, 8, 5], True: [1, 2]}


def test_lookahead_window_stops_when_it_does_not_pay_and_keeps_its_levels():
    config = LookaheadConfig(window=2, ngram=3, guess=2, token_cost=1.0, window_probe=5)
    proposer = LookaheadProposer(config)
    text = [5, 6, 7, 5, 6, 8, 5]
    proposer.start(text)
    branches = []
    for step in range(10):
        proposal = proposer.propose(text, max_tokens=4)
        branches.append(proposal.branch is not None)
        logits = None
        if proposal.branch is not None:
            logits = torch.zeros(len(proposal.branch.logit_rows), 20)
            logits[:, 9] = 1.0  # the window guesses 9 everywhere: never accepted
        text = text + [step + 10]
        proposer.update(text, StepOutcome([step + 10], 0, logits))
    # 2 x (N - 1) = 4 warm-up steps, then only the probes: every 5th step (5 and 10).
    assert branches == [True] * 5 + [False] * 4 + [True]
    assert proposer.levels == [[9, 9], [9, 9]]
    always = LookaheadProposer(LookaheadConfig(window=2, ngram=3, guess=2, token_cost=0.0))
    always.start(text)
    assert all(always.propose(text, max_tokens=4).branch is not None for _ in range(10))


def test_lookahead_proposer_feeds_nothing_when_the_step_holds_x0_alone():
    config = LookaheadConfig(window=3, ngram=3, guess=2)
    proposer = LookaheadProposer(config)
    text = [5, 6, 7, 5, 6, 8, 5]
    proposer.start(text)
    assert proposer.propose(text, max_tokens=0) == Proposal()  # no candidates, no window
    # Without a window's logits the window stays as it was; the pool still learns the text.
    proposer.update(text + [6], StepOutcome([6], 0, None))
    assert len(proposer.levels) == 1 and proposer.pool.get(5) == [[6, 8], [6, 7]]
    proposal = proposer.propose(text + [6], max_tokens=1)
    # The copy after the first "5 6", then the pool's tails of x0 = 6, newest first, cut to 1.
    assert proposal.candidates == [[7], [8], [7]]
    assert proposal.branch is not None and len(proposal.branch.tokens) == 3


def test_copy_length_doubles_to_its_most_and_falls_back_on_a_miss():
    length = CopyLength(8, 32)  # the docstring's example
    lengths = []
    for _ in range(4):
        lengths.append(length.value)
        length.judge(list(range(length.value)), list(range(length.value)) + [99])
    assert lengths == [8, 16, 32, 32]
    length.judge([1, 2, 3], [1, 2, 4])
    assert length.value == 8
    length.judge([], [5])  # no copy this step: nothing to learn
    assert length.value == 8
    fixed = CopyLength(8, 0)
    fixed.judge([1], [1, 2])
    assert fixed.value == 8


def test_prompt_lookup_copy_grows_only_when_asked():
    text = [1, 2] + list(range(10, 40)) + [1, 2]
    for most, expected in ((0, [2, 2, 2]), (8, [2, 4, 8])):
        proposer = PromptLookupProposer(
            PromptLookupConfig(num_draft_tokens=2, max_draft_tokens=most))
        context = list(text)
        proposer.start(context)
        lengths = []
        for _ in range(3):
            copied = proposer.propose(context, max_tokens=16).candidates[0]
            lengths.append(len(copied))
            context += copied
            proposer.update(context, StepOutcome(copied, len(copied)))
        assert lengths == expected, most


def test_lookahead_copy_grows_while_accepted_whole_and_resets_after_a_miss():
    config = LookaheadConfig(window=1, ngram=2, guess=1, lookup_tokens=2, lookup_max_tokens=5)
    proposer = LookaheadProposer(config)
    passage = list(range(10, 40))
    text = [1, 2] + passage + [1, 2]  # the text repeats its start: copies follow "1 2"
    proposer.start(text)

    def step(accept: int | None = None) -> int:
        """Propose, commit the copy's first ``accept`` tokens (all if None); its length."""
        copied = proposer.propose(text, max_tokens=16).candidates[0]
        committed = copied[:accept]
        text.extend(committed)
        proposer.update(text, StepOutcome(committed, len(committed), None))
        return len(copied)

    # Copies accepted whole: 2 tokens, then 4, then 5 (the cap), and the cap holds.
    assert [step() for _ in range(4)] == [2, 4, 5, 5]
    assert step(accept=1) == 5  # a copy cut short...
    assert step() == 2  # ...brings the length back
    assert step() == 4
    # A step of x0 alone (a busy server) copies nothing, so whatever it commits, the length
    # stays where it was.
    assert proposer.propose(text, max_tokens=0) == Proposal()
    text.append(0)
    proposer.update(text, StepOutcome([0], 0, None))
    text.pop()
    assert step() == 5


def test_lookahead_copy_length_stays_fixed_without_a_larger_max():
    config = LookaheadConfig(window=1, ngram=2, guess=1, lookup_tokens=2, lookup_max_tokens=0)
    proposer = LookaheadProposer(config)
    text = [1, 2, 3, 4, 5, 6, 1, 2]
    proposer.start(text)
    assert proposer.propose(text, max_tokens=16).candidates[0] == [3, 4]
    proposer.update(text + [3, 4], StepOutcome([3, 4], 2, None))  # accepted whole
    assert proposer.propose(text + [3, 4], max_tokens=16).candidates[0] == [5, 6]  # not 4 long


# --- prompt-lookup matching ----------------------------------------------------------------


def test_find_continuation_examples():
    assert find_continuation([1, 2, 3, 4, 9, 2, 3], 2, 1, 2) == [4, 9]  # the docstring's
    # The first earlier occurrence wins, never the suffix itself.
    assert find_continuation([1, 2, 7, 1, 2, 8, 1, 2], 2, 1, 2) == [7, 1]
    # Longest n first: "9 4 2" first occurred followed by 7; "4 2" first by 8.
    assert find_continuation([4, 2, 8, 9, 4, 2, 7, 9, 4, 2], 3, 1, 2) == [7, 9]
    assert find_continuation([4, 2, 8, 9, 4, 2, 7, 9, 4, 2], 2, 1, 2) == [8, 9]
    assert find_continuation([5, 4, 2, 8, 2, 7, 1, 4, 2], 2, 1, 3) == [8, 2, 7]
    assert find_continuation([5, 4, 2, 8, 2, 7, 1, 4, 2], 1, 1, 3) == [8, 2, 7]
    assert find_continuation([5, 2, 6, 4, 2, 8, 1, 4, 2], 2, 1, 2) == [8, 1]
    assert find_continuation([5, 2, 6, 4, 2, 8, 1, 4, 2], 1, 1, 2) == [6, 4]
    # min_ngram bounds the fallback.
    assert find_continuation([5, 2, 9, 4, 2], 3, 2, 3) == []
    assert find_continuation([5, 2, 9, 4, 2], 3, 1, 3) == [9, 4, 2]
    # No earlier occurrence at all; the suffix never matches itself.
    assert find_continuation([1, 2, 3], 3, 1, 4) == []
    assert find_continuation([7], 2, 1, 4) == []
    # The continuation may be shorter than asked, at the end of the text.
    assert find_continuation([1, 2, 1], 1, 1, 5) == [2, 1]


def brute_force_continuation(tokens, max_ngram, min_ngram, length):
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for i in range(len(tokens) - n):
            if tokens[i : i + n] == suffix:
                return tokens[i + n : i + n + length]
    return []


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=30),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 6),
)
def test_find_continuation_follows_an_earlier_occurrence(tokens, a, b, length):
    max_ngram, min_ngram = max(a, b), min(a, b)
    result = find_continuation(tokens, max_ngram, min_ngram, length)
    assert isinstance(result, list) and len(result) <= length
    if result:
        # Some n-gram suffix occurred earlier (not as the suffix itself) followed by result.
        assert any(
            tokens[i : i + n] == tokens[-n:]
            and tokens[i + n : i + n + len(result)] == result
            and i + n < len(tokens)
            for n in range(min_ngram, max_ngram + 1)
            if n < len(tokens)
            for i in range(len(tokens) - n)
        )
        assert len(result) == length or result[-1:] == tokens[-1:]
    else:
        assert not any(
            tokens[i : i + n] == tokens[-n:]
            for n in range(min_ngram, max_ngram + 1)
            if n < len(tokens)
            for i in range(len(tokens) - n)
        )
    assert result == brute_force_continuation(tokens, max_ngram, min_ngram, length)


# --- the cache: appending in place, keep_new -----------------------------------------------


def filled_cache(past: int, step: int, layers: int = 2) -> tuple[DynamicCache, list]:
    """A cache with ``past + step`` positions per layer; entry values encode (layer, pos)."""
    cache = new_cache()
    tensors = []
    for layer in range(layers):
        pos = torch.arange(past + step, dtype=torch.float64)
        keys = (1000 * layer + pos).reshape(1, 1, -1, 1).expand(1, 2, -1, 3).clone()
        values = -keys
        cache.update(keys[..., :past, :], values[..., :past, :], layer)
        cache.update(keys[..., past:, :], values[..., past:, :], layer)
        tensors.append((keys, values))
    return cache, tensors


@pytest.mark.parametrize(
    "rows",
    [[0, 3, 4], [0, 1, 2], [0], [], [0, 1, 2, 3, 4, 5], [0, 2], [1, 5]],
)
def test_keep_new_keeps_prefix_and_chosen_rows(rows):
    past, step = 10, 6
    cache, tensors = filled_cache(past, step)
    keep_new(cache, past, rows)
    assert cache_length(cache) == past + len(rows)
    index = list(range(past)) + [past + r for r in rows]
    for layer, (keys, values) in enumerate(tensors):
        assert torch.equal(cache.layers[layer].keys, keys[..., index, :])
        assert torch.equal(cache.layers[layer].values, values[..., index, :])


def test_keep_new_then_the_cache_grows_again():
    cache, tensors = filled_cache(4, 3)
    keep_new(cache, 4, [0, 2])
    extra = torch.full((1, 2, 1, 3), 7.0, dtype=torch.float64)
    for layer in range(2):
        cache.update(extra, -extra, layer)
    assert cache_length(cache) == 7
    assert torch.equal(cache.layers[1].keys[..., 5, :], tensors[1][0][..., 6, :])
    assert torch.equal(cache.layers[0].keys[..., -1:, :], extra)


def test_growing_layer_appends_in_place_until_full():
    layer = GrowingLayer()
    states = torch.arange(2 * 3 * 10 * 4, dtype=torch.float32).reshape(2, 3, 10, 4)
    keys, _ = layer.update(states[:, :, :4], -states[:, :, :4])
    first = keys.data_ptr()
    for end in range(5, 11):  # one column at a time, as decoding does
        keys, values = layer.update(states[:, :, end - 1 : end], -states[:, :, end - 1 : end])
        assert keys.data_ptr() == first  # written after the earlier columns, nothing copied
    assert torch.equal(keys, states) and torch.equal(values, -states)
    big = torch.ones(2, 3, GrowingLayer.SPARE + 10, 4)
    keys, _ = layer.update(big, big)  # beyond the spare columns: new buffers, same content
    assert keys.data_ptr() != first
    assert torch.equal(keys[:, :, :10], states) and torch.equal(keys[:, :, 10:], big)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "crop", "keep", "rows"]),
                          st.integers(1, 5)), max_size=25))
def test_growing_layer_holds_what_concatenation_holds(operations):
    """Appends, crops, ``keep_new`` and a batch's row surgery (replacing the tensors) leave the
    same entries in our cache as in transformers' ``DynamicCache``."""
    ours, theirs = new_cache(), DynamicCache()
    generator = torch.Generator().manual_seed(len(operations))
    for cache in (ours, theirs):  # a 3-row prompt of 2 columns
        cache.update(torch.zeros(3, 2, 2, 4), torch.ones(3, 2, 2, 4), 0)
    for operation, size in operations:
        length, rows = cache_length(theirs), theirs.layers[0].keys.shape[0]
        if operation == "append":
            new = torch.randn(rows, 2, size, 4, generator=generator)
            for cache in (ours, theirs):
                cache.update(new, 2 * new, 0)
        elif operation == "crop" and size < length:
            for cache in (ours, theirs):
                cache.crop(-size)
        elif operation == "keep" and size < length:
            for cache in (ours, theirs):
                keep_new(cache, length - size, list(range(0, size, 2)))
        elif operation == "rows" and rows > 1:
            index = torch.tensor([r for r in range(rows) if r != size % rows])
            for cache in (ours, theirs):
                cache.layers[0].batch_select_indices(index)
        assert torch.equal(ours.layers[0].keys, theirs.layers[0].keys)
        assert torch.equal(ours.layers[0].values, theirs.layers[0].values)


class _OldForward(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=None):
        return input_ids


class _NewForward(torch.nn.Module):
    def forward(self, input_ids, cache=None, use_cache=None):
        return input_ids


def test_cache_keyword_follows_the_forward_signature():
    """Before transformers 5.24 the cache is ``past_key_values``, from it ``cache``; a wrapper
    put on one model instance does not hide the class's own name. (That the name chosen for
    the installed transformers raises no deprecation warning, pyproject's filterwarnings
    checks in every test that decodes.)"""
    assert cache_keyword(_OldForward()) == "past_key_values"
    assert cache_keyword(_NewForward()) == "cache"
    wrapped = _NewForward()
    wrapped.forward = lambda *args, **kwargs: None
    assert cache_keyword(wrapped) == "cache"


# --- the accept rules ----------------------------------------------------------------------


def one_hot_logits(best: list[int], vocab: int = 10) -> torch.Tensor:
    logits = torch.zeros(len(best), vocab)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


def test_verify_greedy_follows_the_argmax_path():
    tree = TokenTree(9, [[5, 6, 7], [5, 8]])  # nodes x0, 5, 6, 7, 8
    verdict = verify_greedy(tree, one_hot_logits([5, 8, 0, 0, 3]))
    assert verdict.nodes == [1, 4] and verdict.tokens == [5, 8, 3]
    verdict = verify_greedy(tree, one_hot_logits([5, 6, 7, 2, 0]))  # the whole chain + bonus
    assert verdict.nodes == [1, 2, 3] and verdict.tokens == [5, 6, 7, 2]
    verdict = verify_greedy(tree, one_hot_logits([4, 6, 7, 2, 0]))  # root miss: bonus only
    assert verdict.nodes == [] and verdict.tokens == [4]
    verdict = verify_greedy(TokenTree(9), one_hot_logits([1]))
    assert verdict.nodes == [] and verdict.tokens == [1]


def test_verify_sampling_certain_cases():
    tree = TokenTree(9, [[5, 6], [7]])  # nodes x0, 5, 6, 7
    generator = torch.Generator().manual_seed(0)
    sure = torch.zeros(4, 10)
    sure[0, 5] = sure[1, 6] = sure[2, 1] = sure[3, 3] = 1.0
    for _ in range(20):  # p is a point mass on the proposal: always accepted
        assert verify_sampling(tree, sure, generator).tokens == [5, 6, 1]
    never = torch.full((4, 10), 1 / 8)
    never[:, 5] = never[:, 7] = 0.0
    for _ in range(50):  # p is zero on both children: always rejected, never recovered as them
        verdict = verify_sampling(tree, never, generator)
        assert verdict.nodes == [] and verdict.tokens[0] not in (5, 7)
    p = torch.softmax(torch.randn(4, 10, generator=generator), dim=-1)
    draft = {1: p[0].clone(), 2: p[1].clone()}  # q == p: min(1, p/q) = 1, always accepted
    chain = TokenTree(9, [[5, 6]])
    for _ in range(20):
        assert verify_sampling(chain, p[:3], generator, draft).nodes == [1, 2]


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


# --- statistics ----------------------------------------------------------------------------


def test_generation_stats_numbers():
    stats = GenerationStats(method="lookahead", prompt_tokens=12)
    for forward, proposed, accepted in [(12, 0, 0), (8, 4, 2), (8, 4, 0), (6, 3, 3), (5, 0, 0)]:
        stats.record_step(forward, proposed, accepted)
    stats.new_tokens = 1 + 3 + 1 + 4 + 1
    stats.seconds = 2.0
    assert stats.steps == 5
    assert stats.accepted_per_step == [0, 2, 0, 3, 0]
    assert stats.proposed_per_step == [0, 4, 4, 3, 0]
    assert stats.forward_tokens_per_step == [12, 8, 8, 6, 5]
    assert stats.accepted_per_position == [2, 2, 1]  # steps accepting >= 1, >= 2, >= 3
    assert stats.tokens_per_step == pytest.approx(10 / 5)
    assert stats.tokens_per_second == pytest.approx(5.0)
    assert stats.mean_accepted == pytest.approx((2 + 0 + 3) / 3)  # steps that proposed
    assert stats.mean_forward_tokens == pytest.approx((8 + 8 + 6 + 5) / 4)  # prefill excluded
    data = json.loads(json.dumps(stats.as_dict()))
    assert data["tokens_per_step"] == pytest.approx(2.0)
    assert data["mean_accepted"] == pytest.approx(5 / 3)
    assert data["accepted_per_position"] == [2, 2, 1] and data["method"] == "lookahead"


def test_generation_stats_empty():
    stats = GenerationStats(method="autoregressive")
    assert stats.tokens_per_step == 0.0 and stats.tokens_per_second == 0.0
    assert stats.mean_accepted == 0.0 and stats.mean_forward_tokens == 0.0


def test_stream_yields_what_generate_returns(tiny_lm):
    model = tiny_lm("llama", seed=0)
    ids = torch.tensor([[7, 8, 9, 7, 8, 9, 7, 8]])
    stream = lookahead.stream(model, ids, max_new_tokens=12, method="lookahead")
    steps = list(stream)
    result = lookahead.generate(model, ids, max_new_tokens=12, method="lookahead")
    assert ids[0].tolist() + [t for s in steps for t in s] == result.sequences[0].tolist()
    assert stream.stats.steps == len(steps) == result.stats.steps
    assert result.new_tokens.tolist() == [result.sequences[0, 8:].tolist()]


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


@given(st.integers(1, 100_000))
def test_prefill_length_pads_by_at_most_a_quarter_to_few_lengths(tokens):
    """The server's prefill shapes: never shorter than the prompt, at most 7 tokens or 25 %
    longer, and four lengths per doubling (so few kernels are compiled and kept)."""
    length = prefill_length(tokens)
    assert tokens <= length <= max(tokens + 7, tokens * 5 // 4)
    assert prefill_length(length) == length
    assert prefill_lengths(length)[-1] == length


def test_prefill_lengths_examples():
    assert prefill_lengths(100) == [8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112]
    assert len(prefill_lengths(4096)) == 8 + 4 * 6


def test_decoding_attention_leaves_out_cudnn_on_cuda_and_restores_the_flags() -> None:
    """cuDNN attention plans every new cache length (3-4x a pass on an H200): a CUDA decoding
    pass goes without it, keeps the user's other choices, and puts the flags back."""
    from lookahead.attention import decoding_attention

    flags = torch.backends.cuda
    with decoding_attention(torch.device("cpu")):  # off CUDA, nothing changes
        assert flags.cudnn_sdp_enabled()
    flags.enable_flash_sdp(False)  # as a user might have chosen
    try:
        with decoding_attention(torch.device("cuda")):
            assert not flags.cudnn_sdp_enabled() and not flags.flash_sdp_enabled()
            assert flags.mem_efficient_sdp_enabled() and flags.math_sdp_enabled()
        assert flags.cudnn_sdp_enabled() and not flags.flash_sdp_enabled()
    finally:
        flags.enable_flash_sdp(True)


@pytest.mark.parametrize("method", ["lookahead", "draft"])
def test_every_decoding_forward_runs_in_decoding_attention(tiny_lm, monkeypatch, method) -> None:
    """The prefill, each step and each draft pass enter ``decoding_attention``."""
    import contextlib

    import lookahead.cache

    entered = []

    @contextlib.contextmanager
    def recording(device):
        entered.append(device.type)
        yield

    monkeypatch.setattr(lookahead.cache, "decoding_attention", recording)
    model = tiny_lm("llama")
    options = dict(draft_model=tiny_lm("llama", seed=1)) if method == "draft" else {}
    decoder = lookahead.api.make_decoder(model, torch.tensor([[3, 4, 5, 3, 4]]), 12, method,
                                         **options)
    list(decoder)
    draft_passes = decoder.proposer.forwards if method == "draft" else 0
    assert entered == ["cpu"] * (decoder.stats.steps + draft_passes)
