"""The greedy and sampling accept rules."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead.attention import TokenTree
from lookahead.verify import ARGMAX_BLOCK, argmax, verify_greedy, verify_sampling

pytestmark = pytest.mark.usefixtures("one_thread")


# --- argmax ------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 4), vocab=st.integers(1, 9 * ARGMAX_BLOCK + 5),
       levels=st.integers(1, 6), seed=st.integers(0, 2**31 - 1),
       specials=st.lists(st.sampled_from(["nan", "inf", "-inf"]), max_size=3),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_argmax_is_torch_argmax_with_ties_nan_and_infinities(rows, vocab, levels, seed,
                                                             specials, dtype):
    generator = torch.Generator().manual_seed(seed)
    # few distinct values: many ties, so the first maximum must be found, not any maximum
    logits = torch.randint(0, levels, (rows, vocab), generator=generator).to(dtype)
    for special in specials:
        at = torch.randint(0, rows * vocab, (1,), generator=generator).item()
        logits.view(-1)[at] = float(special)
    assert torch.equal(argmax(logits), torch.argmax(logits, dim=-1))


def test_argmax_keeps_leading_dimensions_and_reads_strided_rows():
    logits = torch.randn(3, 2, 5 * ARGMAX_BLOCK + 7)
    assert torch.equal(argmax(logits), logits.argmax(-1))
    strided = torch.randn(4 * ARGMAX_BLOCK + 1, 6).t()  # rows not contiguous
    assert torch.equal(argmax(strided), strided.argmax(-1))
    late = torch.zeros(2, 6 * ARGMAX_BLOCK + 3)
    late[0, -1] = 1.0  # in the last, shorter block
    late[1, -2:] = float("nan")
    assert argmax(late).tolist() == [late.shape[1] - 1, late.shape[1] - 2]


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
