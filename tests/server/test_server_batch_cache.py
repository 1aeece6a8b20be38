"""``BatchedCache``: the rows' entries kept, packed and compacted, with hand-written values."""

from __future__ import annotations

import torch

from lookahead.batch_cache import BatchedCache


def test_compact_keeps_each_rows_entries() -> None:
    from transformers import DynamicCache

    cache = BatchedCache()
    for length in (3, 5):
        single = DynamicCache()
        keys = torch.arange(length, dtype=torch.float32).view(1, 1, length, 1) + 10 * length
        single.update(keys, keys.clone(), 0)
        cache.add_row(single)
    assert cache.valid.tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    # A step of 3 columns; row 0 keeps its third entry, row 1 nothing (as if it failed).
    step = torch.tensor([[[[-1.0], [-2.0], [-3.0]]], [[[-4.0], [-5.0], [-6.0]]]])
    cache.cache.update(step, step.clone(), 0)
    cache.extend(torch.tensor([[3, 4, 5], [5, 6, 7]]))
    cache.keep(3, [[2], []])
    assert cache.columns == 6  # the step's columns no row kept are cut at once
    assert cache.cache.layers[0].keys[0, 0, 5, 0] == -3 and cache.positions[0, 5] == 5
    assert cache.valid.tolist() == [[True] * 3 + [False] * 2 + [True], [True] * 5 + [False]]
    cache.compact()
    assert cache.columns == 5
    assert cache.cache.layers[0].keys[0, 0, :4, 0].tolist() == [30, 31, 32, -3]
    assert cache.positions[0, :4].tolist() == [0, 1, 2, 5]
    assert cache.valid.tolist() == [[True] * 4 + [False], [True] * 5]
    cache.remove_rows([1])
    assert cache.columns == 4 and cache.rows == 1


def test_keep_packs_each_rows_entries_and_cuts_what_no_row_kept() -> None:
    from transformers import DynamicCache

    cache = BatchedCache()
    single = DynamicCache()
    prompt = torch.zeros(1, 1, 2, 1)
    single.update(prompt, prompt.clone(), 0)
    cache.add_row(single)
    cache.add_row(single)
    # One step of 4 columns per row, values = 10 * row + column.
    step = (torch.arange(4.0) + torch.tensor([[0.0], [10.0]])).view(2, 1, 4, 1)
    cache.cache.update(step, step + 100, 0)
    cache.extend(torch.tensor([[2, 3, 3, 4], [2, 3, 4, 5]]))
    cache.keep(4, [[0, 2, 3], [0, 1]])
    layer = cache.cache.layers[0]
    assert cache.columns == 5  # 2 prompt + the 3 the longest row kept
    assert layer.keys[0, 0, 2:, 0].tolist() == [0, 2, 3]
    assert layer.keys[1, 0, 2:4, 0].tolist() == [10, 11]  # and one column of waste
    assert layer.values[0, 0, 2:, 0].tolist() == [100, 102, 103]
    assert cache.positions[0, 2:].tolist() == [2, 3, 4]
    assert cache.positions[1, 2:4].tolist() == [2, 3]
    assert cache.valid[:, 2:].tolist() == [[True, True, True], [True, True, False]]
    cache.keep(0, [[], []])  # nothing was fed: nothing changes
    assert cache.columns == 5
