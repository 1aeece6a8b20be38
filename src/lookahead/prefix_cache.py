"""KV entries of earlier texts, kept so that a text that starts the same way reads only the rest.

A chat sends the whole conversation at every turn, and apps put the same system prompt in every
request: most of a prompt was often computed before. ``PrefixCache`` keeps the KV entries of
earlier texts (a prompt after its prefill, a whole text when its request ends) within a memory
budget, least recently used first out, and ``lookup`` finds the longest stored prefix of a new
prompt. The request then prefills only the tokens after it (``Decoder.prefill``).

On the quantized path every row is computed alone, whatever the pass it is in, so the entries
of a reused prefix are bit for bit those a fresh prefill would compute, and the text is the
same with the cache on or off (``tests/exactness/test_prefix_reuse.py``). On float weights the
entries of tokens that were decoded in a step of several rows may round differently from a
prefill in the last bits, as any batch does.

Example::

    prefixes = PrefixCache(budget_bytes=1 << 30)
    decoder = make_decoder(model, ids, 64, "lookahead", prefix=prefixes.lookup(ids[0].tolist()))
    ...  # decode; then keep the text's entries for later requests:
    prefixes.store(decoder.context[:-1], entries_of(decoder.cache))
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import Cache

from lookahead.cache import new_cache

logger = logging.getLogger(__name__)

# (keys, values) of every layer, each [1, H, L, D].
Entries = tuple[tuple[torch.Tensor, torch.Tensor], ...]


@dataclass(frozen=True)
class CachedPrefix:
    """The KV entries of a text's first ``length`` tokens: ``layers[i]`` is layer i's (keys,
    values), each [1, H, length, D]. Read-only: ``to_cache`` copies them."""

    length: int
    layers: Entries

    def to_cache(self) -> Cache:
        """A new cache (``lookahead.cache.new_cache``) holding these entries, ready to append."""
        cache = new_cache()
        for index, (keys, values) in enumerate(self.layers):
            cache.update(keys, values, index)
        return cache

    @classmethod
    def from_cache(cls, cache: Cache) -> CachedPrefix:
        """The entries a transformers ``Cache`` holds (batch of one), e.g. an earlier call's
        ``past_key_values``; every layer must hold the same number of positions."""
        if not isinstance(cache, Cache):
            raise TypeError(f"past_key_values must be a transformers Cache, got "
                            f"{type(cache).__name__}")
        layers = entries_of(cache)
        lengths = {keys.shape[2] for keys, _ in layers}
        if len(lengths) > 1 or any(keys.shape[0] != 1 for keys, _ in layers):
            raise ValueError("past_key_values must hold one sequence, the same positions in "
                             f"every layer; got lengths {sorted(lengths)}")
        return cls(lengths.pop() if lengths else 0, layers)


def entries_of(cache: Cache) -> Entries:
    """Every layer's (keys, values) of a one-row cache, [1, H, L, D] each (views)."""
    return tuple((layer.keys, layer.values) for layer in cache.layers if layer.is_initialized)


@dataclass
class _Entry:
    tokens: np.ndarray  # int64 [L]
    layers: Entries
    nbytes: int


class PrefixCache:
    """Texts' KV entries by their token ids, at most ``budget_bytes`` in all.

    ``queries`` / ``hits``: prompt tokens looked up, and how many of them were found (the
    figures vLLM reports as ``prefix_cache_queries`` / ``prefix_cache_hits``). Not thread
    safe: one thread (the server's engine, a chat) owns it.
    """

    def __init__(self, budget_bytes: int) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget_bytes must be an int >= 0, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._next = 0
        self.nbytes = 0
        self.queries = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int]) -> CachedPrefix | None:
        """The longest stored prefix of ``tokens`` that leaves at least one token to run (the
        prompt's last token must be fed to get its logits); None when none is stored."""
        self.queries += len(tokens)
        wanted = np.asarray(tokens, dtype=np.int64)[:-1]
        best, best_key = 0, None
        for key, entry in self._entries.items():
            n = min(len(entry.tokens), len(wanted))
            differ = np.flatnonzero(entry.tokens[:n] != wanted[:n])
            common = int(differ[0]) if len(differ) else n
            if common >= best and common > 0:  # ties: the most recently used (later)
                best, best_key = common, key
        if best_key is None:
            return None
        self._entries.move_to_end(best_key)
        self.hits += best
        layers = tuple((k[:, :, :best], v[:, :, :best]) for k, v in self._entries[best_key].layers)
        return CachedPrefix(best, layers)

    def store(self, tokens: Sequence[int], layers: Entries) -> None:
        """Keep ``layers`` ([1, H, L, D] per layer), the entries of ``tokens`` (L ids), as
        copies. A stored text that ``tokens`` extends is dropped (this one holds it); a text
        that already extends ``tokens`` is kept instead. The least recently used texts go
        while the budget is exceeded; a text larger than the budget is not kept."""
        length = len(tokens)
        if length == 0 or any(k.shape[2] != length for k, _ in layers):
            raise ValueError(f"layers must hold {length} positions each, one per token")
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size()
                     for k, v in layers)
        if nbytes > self.budget_bytes:
            return
        ids = np.asarray(tokens, dtype=np.int64)
        for key, entry in list(self._entries.items()):
            n = min(len(entry.tokens), length)
            if np.array_equal(entry.tokens[:n], ids[:n]):
                if len(entry.tokens) >= length:
                    self._entries.move_to_end(key)
                    return
                self._drop(key)
        copies = tuple((k.detach().clone(), v.detach().clone()) for k, v in layers)
        self._entries[self._next] = _Entry(ids, copies, nbytes)
        self._next += 1
        self.nbytes += nbytes
        while self.nbytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        for key in list(self._entries):
            self._drop(key)

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.nbytes -= entry.nbytes
        logger.debug("prefix cache: dropped a text of %d tokens", len(entry.tokens))
