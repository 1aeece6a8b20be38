"""The cache: appending in place, keep_new, the forward's cache keyword."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from lookahead.cache import GrowingLayer, cache_keyword, cache_length, keep_new, new_cache

pytestmark = pytest.mark.usefixtures("one_thread")


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
