"""``lookahead.prefix_cache``: the longest stored prefix, the budget, least recently used out."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead.prefix_cache import CachedPrefix, PrefixCache


def entries(tokens, layers: int = 2, heads: int = 1, dim: int = 2):
    """Per layer (keys, values) [1, H, L, D], each entry the float of its token and layer, so
    that a slice shows which tokens it holds."""
    base = torch.tensor(tokens, dtype=torch.float32)
    return tuple(
        (base[None, None, :, None].expand(1, heads, len(tokens), dim) + 1000 * i,
         -base[None, None, :, None].expand(1, heads, len(tokens), dim) - 1000 * i)
        for i in range(layers))


def size(tokens) -> int:
    return sum(k.numel() * 4 + v.numel() * 4 for k, v in entries(tokens))


def test_lookup_finds_the_longest_stored_prefix_and_leaves_a_token_to_run() -> None:
    cache = PrefixCache(1 << 20)
    cache.store([1, 2, 3, 4], entries([1, 2, 3, 4]))
    cache.store([1, 2, 9], entries([1, 2, 9]))
    found = cache.lookup([1, 2, 3, 4, 5, 6])
    assert found.length == 4 and found.layers[1][0][0, 0, :, 0].tolist() == [1001, 1002, 1003, 1004]
    assert cache.lookup([1, 2, 3, 4]).length == 3  # the last token must be run
    assert cache.lookup([1, 2, 9, 9]).length == 3
    assert cache.lookup([7, 1, 2]) is None
    assert (cache.queries, cache.hits) == (6 + 4 + 4 + 3, 4 + 3 + 3)


def test_a_text_that_extends_a_stored_one_replaces_it() -> None:
    cache = PrefixCache(1 << 20)
    cache.store([1, 2], entries([1, 2]))
    cache.store([1, 2, 3], entries([1, 2, 3]))
    assert len(cache) == 1 and cache.nbytes == size([1, 2, 3])
    cache.store([1, 2], entries([1, 2]))  # already held by the longer text
    assert len(cache) == 1 and cache.lookup([1, 2, 3, 4]).length == 3


def test_the_least_recently_used_text_goes_when_the_budget_is_full() -> None:
    cache = PrefixCache(3 * size([0] * 4))
    for first in (1, 2, 3):
        cache.store([first] * 4, entries([first] * 4))
    assert cache.lookup([1, 1, 1, 1, 5]).length == 4  # 1 is now the most recent
    cache.store([4] * 4, entries([4] * 4))
    assert cache.lookup([2, 2, 2, 2, 5]) is None  # 2 was the least recently used
    assert [cache.lookup([t] * 5) is not None for t in (1, 3, 4)] == [True, True, True]
    assert cache.nbytes <= cache.budget_bytes
    cache.store([5] * 40, entries([5] * 40))  # larger than the budget: not kept
    assert cache.lookup([5] * 41) is None and len(cache) == 3


def test_stored_entries_are_copies_and_a_prefix_becomes_a_cache() -> None:
    cache = PrefixCache(1 << 20)
    layers = entries([1, 2, 3])
    cache.store([1, 2, 3], layers)
    restored = cache.lookup([1, 2, 3, 4]).to_cache()
    assert restored.get_seq_length() == 3
    assert torch.equal(restored.layers[1].values, layers[1][1])
    assert CachedPrefix.from_cache(restored).length == 3


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="budget_bytes must be an int >= 0"):
        PrefixCache(-1)
    with pytest.raises(ValueError, match="layers must hold 3 positions"):
        PrefixCache(1 << 20).store([1, 2, 3], entries([1, 2]))
    with pytest.raises(TypeError, match="past_key_values must be a transformers Cache"):
        CachedPrefix.from_cache([1, 2])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=5),
       st.lists(st.integers(0, 3), min_size=1, max_size=10))
def test_lookup_agrees_with_a_brute_force(texts, prompt) -> None:
    cache = PrefixCache(1 << 30)
    for text in texts:
        cache.store(text, entries(text))

    def common(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    best = max(common(text, prompt[:-1]) for text in texts)
    found = cache.lookup(prompt)
    assert (found.length if found else 0) == best
    if found:
        assert found.layers[0][0][0, 0, :, 0].tolist() == [float(t) for t in prompt[:best]]
