"""TokenTree, the step layout and its masks, the lookahead window's visibility."""


from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead.attention import Branch, TokenTree, attention_mask, layout_step

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
