"""Rolling the KV cache back to the accepted tokens after a step.

A step appends T entries to every layer of the cache. Only the entries of ``x0`` and of the
accepted candidate tokens are valid continuations of the text; the rest (rejected candidates,
the lookahead window) must go. ``keep_new`` keeps the prefix and the chosen new entries.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    """An empty cache whose layers all keep every position.

    Built without the model config on purpose: sliding-window layers would drop old entries on
    their own, while we enforce windows through the attention mask (see ``attention.py``).
    """
    return DynamicCache()


def cache_length(cache: DynamicCache) -> int:
    """Number of positions held (the same in every layer)."""
    return cache.get_seq_length()


def keep_new(cache: DynamicCache, past_len: int, rows: list[int]) -> None:
    """Keep positions ``0 .. past_len - 1`` and, of the step's new entries, those at ``rows``.

    ``rows`` are indices into the step's input (0 = the first new entry) in increasing order.
    Example: past_len=10, a step of 6 tokens, rows=[0, 3, 4] leaves 13 positions: the old 10,
    then the step's entries 0, 3 and 4 in that order. A contiguous ``rows == [0 .. k-1]`` is a
    plain crop, which copies nothing; otherwise only the kept rows are moved into place.
    """
    if rows != list(range(len(rows))):
        source = torch.tensor(rows, dtype=torch.long) + past_len
        for layer in cache.layers:
            source = source.to(layer.keys.device)
            # Rows only move to lower indices, and the gather copies before the write.
            layer.keys[..., past_len : past_len + len(rows), :] = layer.keys[..., source, :]
            layer.values[..., past_len : past_len + len(rows), :] = layer.values[..., source, :]
    drop = cache_length(cache) - past_len - len(rows)
    if drop > 0:
        cache.crop(-drop)
