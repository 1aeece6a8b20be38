"""The lookahead proposer: the window, the n-gram pool, the gauges, the copy length."""

from __future__ import annotations

import pytest
import torch

from lookahead.config import LookaheadConfig, PromptLookupConfig
from lookahead.proposers.base import Proposal, StepOutcome
from lookahead.proposers.gauges import SOURCE_PRIORS, DepthGauge, WindowGauge
from lookahead.proposers.lookahead import LookaheadProposer, NGramPool, window_visibility
from lookahead.proposers.prompt_lookup import CopyLength, PromptLookupProposer

pytestmark = pytest.mark.usefixtures("one_thread")


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


def test_priced_depths_feed_while_the_expected_tokens_outgrow_the_cost():
    steep = DepthGauge(token_cost=0.2, step_costs=(1.0, 1.1, 1.25, 1.45, 1.7))
    for _ in range(30):  # copies right for 2 tokens, then wrong
        steep.record([([1, 2, 9, 9], "text")], fed=4, committed=[1, 2, 3])
    # rates ~1, ~1, ~0: e = 1 -> 2 -> 3 beats 1.0 -> 1.1 -> 1.25; the third token cannot pay
    assert steep.priced_depths([([1, 2, 9, 9], "text")]) == [2]
    # Untried, unmeasured sources count at even odds: 1.5 / 1.1 > 1, 2 / 1.25 > 1.5 / 1.1,
    # 2.5 / 1.45 > 2 / 1.25
    assert steep.priced_depths([([4, 5, 6], "memory")]) == [3]
    steeper = DepthGauge(token_cost=0.2, step_costs=(1.0, 1.3, 1.7, 2.2))  # 2.5 / 2.2 < 2 / 1.7
    assert steeper.priced_depths([([4, 5, 6], "memory")]) == [2]
    # A prefix already fed comes free; a second candidate pays only what the costs allow.
    assert steep.priced_depths([([1, 2, 9], "text"), ([1, 2, 7], "text")]) == [2, 2]
    flat = DepthGauge(token_cost=0.0, step_costs=(1.0,))  # tokens free: everything goes in
    assert flat.priced_depths([([1, 2, 3], "text"), ([4, 5], "pool")]) == [3, 2]


def test_priced_depths_start_from_what_each_source_was_measured_to_be_worth():
    """Priced, a fresh request's copies start near their measured rates, falling with depth,
    and the pool's n-grams far below them; an unmeasured source at even odds; unpriced,
    every depth is tried."""
    priced = DepthGauge(token_cost=0.1, step_costs=(1.0, 1.0))
    text = [priced.prior_of("text", d) for d in range(10)]
    assert text[:6] == list(SOURCE_PRIORS["text"]) and text[6:] == [text[5]] * 4
    assert text == sorted(text, reverse=True)
    assert priced.prior_of("pool") < priced.prior_of("text1") < priced.prior_of("text")
    assert priced.prior_of("memory", 3) == 0.5
    assert DepthGauge(token_cost=0.1).prior_of("pool", 2) == 1.0
    # SmolLM2-135M's curve here (8 tokens 1.45x one): a fresh copy goes in 5 deep and a pool
    # n-gram not at all, where at even odds both went in whole.
    costs = (1.0, 1.0, 1.08, 1.17, 1.22, 1.27, 1.36, 1.45)
    copy, pooled = ([1, 2, 3, 4, 5, 6, 7, 8], "text"), ([6, 7, 8, 9], "pool")
    fresh = DepthGauge(token_cost=0.05, step_costs=costs)
    assert fresh.priced_depths([copy, pooled]) == [5, 0]
    even = DepthGauge(token_cost=0.05, step_costs=costs)
    even.priors = {}
    assert even.priced_depths([copy, pooled]) == [8, 4]
    # the rates move from there as the request's steps tell: copies right for 2 tokens
    for _ in range(3):
        fresh.record([copy], fed=5, committed=[1, 2, 7])
    assert fresh.priced_depths([copy]) == [2]


def test_priced_depth_gauge_counts_a_hit_only_past_the_candidates_before_it():
    gauge = DepthGauge(token_cost=0.2, step_costs=(1.0, 1.1))
    gauge.record([([1, 2, 3], "memory"), ([1, 2, 8], "datastore"), ([1, 4], "other")],
                 fed=5, committed=[1, 2, 3, 4])
    # From even odds (0.5, sources not measured), a hit moves a rate to 0.75, a miss to 0.25.
    assert gauge._rates["memory"] == [[0.75, 2], [0.75, 2], [0.75, 2]]
    # The datastore's first two tokens were right, but the copy already had them: no gain.
    assert gauge._rates["datastore"] == [[0.25, 2], [0.25, 2], [0.25, 2]]
    assert gauge._rates["other"] == [[0.25, 2], [0.25, 2]]
    unpriced = DepthGauge(token_cost=0.2)  # the marginal rates, as before
    unpriced.record([([1, 2, 3], "text"), ([1, 2, 8], "pool")], fed=5, committed=[1, 2, 3, 4])
    assert unpriced._rates["pool"] == [[1.0, 2], [1.0, 2], [0.5, 2]]


def test_priced_lookahead_copies_after_the_last_token_alone_only_when_priced():
    text = [7, 1, 2, 3, 9, 8, 1]  # "1" occurred before, its last-but-one token never did
    for costs, expected in ((None, []), ((1.0, 1.01, 1.02, 1.03), [[2, 3, 9]])):
        config = LookaheadConfig(window=1, ngram=2, guess=1, lookup_tokens=3, token_cost=0.01,
                                 prompt_pool=False, output_pool=False, step_costs=costs,
                                 window_probe=1 << 20)
        proposer = LookaheadProposer(config)
        proposer.start(text)
        proposer.gauge.warm_up = 0  # no window
        assert proposer.propose(text, max_tokens=4).candidates == expected, costs


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


def _window_steps(proposer, text, steps, guess):
    """Run ``steps`` steps whose window guesses ``guess`` everywhere and whose committed
    token is never a guess; whether each step ran the window."""
    branches = []
    for step in range(steps):
        proposal = proposer.propose(text, max_tokens=4)
        branches.append(proposal.branch is not None)
        logits = None
        if proposal.branch is not None:
            logits = torch.zeros(len(proposal.branch.logit_rows), 40)
            logits[:, guess] = 1.0
        text = text + [step + 10]
        proposer.update(text, StepOutcome([step + 10], 0, logits))
    return branches


def test_priced_window_runs_from_the_first_step_only_where_it_pays():
    """Priced on the step costs, the window is priced on its full levels: where they are
    free it runs from the first step (no warm-up), where they cost more than its prior
    gain (a CPU's curve) it never runs -- and where it runs but adds nothing, it stops."""
    text = [5, 6, 7, 5, 6, 8, 5]
    flat = LookaheadProposer(LookaheadConfig(window=2, ngram=3, guess=2, step_costs=(1.0,),
                                             token_cost=0.0))
    flat.start(text)
    assert _window_steps(flat, text, 8, guess=9) == [True] * 8
    # 4 window tokens at 0.1 each: (1 + 0.2) x 1.0 < 1 x 1.4
    steep = LookaheadProposer(LookaheadConfig(window=2, ngram=3, guess=2,
                                              step_costs=(1.0, 1.1, 1.2, 1.3, 1.4)))
    steep.start(text)
    assert _window_steps(steep, text, 20, guess=9) == [False] * 20
    # a small step on a gentle curve: (1 + 0.2) x 1.0 >= 1 x 1.12 runs it, until its measured
    # gain (nothing: its guesses never come) falls below 0.12
    gentle = LookaheadProposer(LookaheadConfig(window=2, ngram=3, guess=2,
                                               step_costs=(1.0, 1.03, 1.06, 1.09, 1.12)))
    gentle.start(text)
    runs = _window_steps(gentle, text, 12, guess=9)
    assert runs[:3] == [True] * 3 and not any(runs[-4:]), runs


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
