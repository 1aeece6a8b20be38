"""The KV cache of one text, and rolling it back to the accepted tokens after a step.

A step appends T entries to every layer of the cache. Only the entries of ``x0`` and of the
accepted candidate tokens are valid continuations of the text; the rest (rejected candidates,
the lookahead window) must go. ``keep_new`` keeps the prefix and the chosen new entries.

Transformers' ``DynamicLayer`` appends by concatenation, which copies the whole layer at every
step; a ``GrowingLayer`` writes the new entries into spare columns instead, so that a step
costs what it adds, and rolling back only shortens a view (nothing is copied).
"""

from __future__ import annotations

import inspect

import torch
from transformers import Cache
from transformers.cache_utils import DynamicLayer

from lookahead.attention import decoding_attention


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys`` / ``values`` ([B, H, S, D]) are views of the first S
    columns of larger buffers: ``update`` writes the new columns after them in place.

    The buffers grow by half their size (at least ``SPARE`` columns) when full. Whoever
    replaces ``keys`` / ``values`` by other tensors (a batch's cache surgery) may: the next
    ``update`` notices that they are no longer views of the buffers and copies them into new
    ones. Writing into the views (``keep_new``) writes into the buffers, as intended.

    The views this layer made itself (by ``update`` or ``crop``) are remembered, so that the
    next ``update`` knows them by identity: checking pointers, strides and shapes took about
    10 us a layer, 0.3 ms of a 28-layer step.
    """

    SPARE = 64

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._views: tuple[torch.Tensor, torch.Tensor] | None = None  # made here, of _buffers

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Append key/value states [B, H, T, D]; return every entry, [B, H, S + T, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if not self._holds(end):
            self._reallocate(key_states, value_states, length, end)
        keys, values = self._buffers
        keys[:, :, length:end] = key_states
        values[:, :, length:end] = value_states
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        self._views = (self.keys, self.values)
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` entries (transformers' convention): a shorter
        view of the same buffers."""
        own = self.is_initialized and self._own_views()
        super().crop(tokens_to_remove)
        if own:
            self._views = (self.keys, self.values)

    def _own_views(self) -> bool:
        """Whether ``keys`` / ``values`` are still the views this layer made of its buffers."""
        views = self._views
        return views is not None and views[0] is self.keys and views[1] is self.values

    def _holds(self, end: int) -> bool:
        """Whether ``keys`` / ``values`` are still views of the buffers, with room up to ``end``."""
        if self._own_views():
            return end <= self._buffers[0].shape[2]
        if self._buffers is None or self.keys.numel() == 0:
            return False
        return all(
            view.data_ptr() == buffer.data_ptr() and view.stride() == buffer.stride()
            and view.shape[:2] == buffer.shape[:2] and end <= buffer.shape[2]
            for view, buffer in zip((self.keys, self.values), self._buffers)
        )

    def _reallocate(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int,
                    end: int) -> None:
        """New buffers of ``end`` columns and spare ones, holding the current entries."""
        columns = end + max(self.SPARE, end // 2)
        self._buffers = tuple(
            self._buffer(states, current, length, columns)
            for states, current in ((key_states, self.keys), (value_states, self.values))
        )

    @staticmethod
    def _buffer(states: torch.Tensor, current: torch.Tensor, length: int,
                columns: int) -> torch.Tensor:
        """[B, H, columns, D] like ``states``, holding ``current``'s first ``length`` columns."""
        batch, heads, _, dim = states.shape
        buffer = states.new_empty(batch, heads, columns, dim)
        if length:
            buffer[:, :, :length] = current
        return buffer


def new_cache() -> Cache:
    """An empty cache whose layers all keep every position, appending in place (a layer is made
    on first use, one per model layer).

    Built without the model config on purpose: sliding-window layers would drop old entries on
    their own, while we enforce windows through the attention mask (see ``attention.py``).
    """
    return Cache(layer_class_to_replicate=GrowingLayer)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword under which ``model``'s forward takes the KV cache.

    Transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns, and goes in
    5.40); earlier 5.x releases and models written for them know only ``past_key_values``. The
    class's forward is read, not the instance's, so that a wrapper set on one model (a test's,
    a profiler's) does not hide the name. Look it up once per caller (a request's ``Decoder``,
    the server's ``Engine``: ~17 us, not once per step) and pass the cache as
    ``model(**{keyword: cache}, ...)``.
    """
    forward = getattr(type(model), "forward", None)
    if forward is None:  # not a module (a test's stand-in): the name every 5.x release takes
        return "past_key_values"
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def decoding_pass(model: torch.nn.Module, keyword: str, cache: Cache, **inputs):
    """``model(**inputs)`` through ``cache`` (passed as ``keyword``, see ``cache_keyword``),
    in ``decoding_attention``: every decoding forward -- a request's, a draft model's, the
    server's batched step -- goes through here, so all of them get the same kernels."""
    with decoding_attention(model.device):
        return model(**inputs, **{keyword: cache}, use_cache=True)


def cache_length(cache: Cache) -> int:
    """Number of positions held (the same in every layer)."""
    return cache.get_seq_length()


def keep_new(cache: Cache, past_len: int, rows: list[int]) -> None:
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
