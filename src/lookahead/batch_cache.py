"""The KV cache of a batch of requests, and the inputs of one batched step.

One cache (``lookahead.cache.new_cache``) holds every running request: in each layer keys and
values are ``[B, H, S, D]``, one row per request. Rows have different lengths and a step keeps a
different number of entries in each row, so instead of deleting every rejected entry we keep,
beside the tensors,

* ``valid``: bool ``[B, S]``, whether column s of row b holds one of that request's cached
  tokens (prompt, or a token a step accepted);
* ``positions``: long ``[B, S]``, the absolute position of each entry (for sliding windows).

A step feeds every row ``T`` tokens (each request's step input, padded to the longest), so the
model appends T columns to every row; afterwards each request's x0 and accepted nodes move to
the front of those columns and the columns no row kept are cut (``keep``). A row that keeps
fewer than another leaves invalid columns, which the 4D mask hides. When rows carry many,
``compact`` gathers the valid ones to the left.

The bookkeeping (``valid``, ``positions``) stays on the CPU, where the masks are built; the
step's inputs go to the device of the cached keys, the model's, in one move.

Example (two requests, S=4, a step of T=3)::

    valid before      [[1 1 1 0]      row 1 was added with a 3-token prompt
                       [1 1 1 1]]
    step rows kept    row 0: [0, 2]   row 1: [0]
    valid after       [[1 1 1 0 | 1 1]
                       [1 1 1 1 | 1 0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import Cache

from lookahead.attention import StepLayout, batched_attention_mask, mask_to
from lookahead.cache import cache_keyword, decoding_pass


@dataclass(frozen=True)
class StepBatch:
    """The padded input of one batched forward pass.

    input_ids, position_ids: long [B, T]. mask: additive float [B, 1, T, S + T] (or one per
    layer type, see ``batched_attention_mask``). logit_rows: bool [B, T], the rows whose logits
    some request needs (``logits_to_keep``). order[b]: where request b's ``layout.logit_rows``
    sit in the flat logits [N, V] the model returns for ``logit_rows``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    mask: torch.Tensor | dict[str, torch.Tensor]
    logit_rows: torch.Tensor
    order: list[torch.Tensor]

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]


class BatchedCache:
    """Rows of cached keys/values, one per running request, with per-column validity."""

    def __init__(self) -> None:
        self.cache: Cache | None = None
        self.keyword: str | None = None  # the model's name for its cache argument
        self.valid = torch.zeros(0, 0, dtype=torch.bool)  # [B, S]
        self.positions = torch.zeros(0, 0, dtype=torch.long)  # [B, S]

    @property
    def rows(self) -> int:
        return self.valid.shape[0]

    @property
    def columns(self) -> int:
        return self.valid.shape[1]

    @property
    def device(self) -> torch.device:
        """Where the cached keys and values live (the model's device; the CPU when empty)."""
        if self.cache is None or not self.cache.layers:
            return torch.device("cpu")
        return self.cache.layers[0].keys.device

    def row_lengths(self) -> list[int]:
        """Valid entries of each row."""
        return self.valid.sum(dim=1).tolist()

    def add_row(self, single: Cache) -> None:
        """Append the cache of one prefilled request (batch 1, positions ``0 .. L-1``) as a row."""
        length = single.get_seq_length()
        if self.cache is None:
            self.cache = single
            self.valid = torch.ones(1, length, dtype=torch.bool)
            self.positions = torch.arange(length).unsqueeze(0)
            return
        width = max(self.columns, length)
        self._pad_columns(width)
        for ours, theirs in zip(self.cache.layers, single.layers):
            ours.keys = torch.cat([ours.keys, _pad(theirs.keys, width)], dim=0)
            ours.values = torch.cat([ours.values, _pad(theirs.values, width)], dim=0)
        row_valid = torch.zeros(1, width, dtype=torch.bool)
        row_valid[0, :length] = True
        row_positions = torch.zeros(1, width, dtype=torch.long)
        row_positions[0, :length] = torch.arange(length)
        self.valid = torch.cat([self.valid, row_valid])
        self.positions = torch.cat([self.positions, row_positions])

    def row_entries(self, row: int) -> tuple[tuple[torch.Tensor, torch.Tensor], ...] | None:
        """Row ``row``'s valid entries in position order, per layer (keys, values), each
        [1, H, L, D]: views where they sit in the first L columns, else copies. None when its
        positions are not 0 .. L-1 (a text that is not one prefix)."""
        columns = self.valid[row].nonzero().squeeze(1)
        length = len(columns)
        if not torch.equal(self.positions[row, columns], torch.arange(length)):
            return None
        if torch.equal(columns, torch.arange(length)):
            return tuple((layer.keys[row : row + 1, :, :length],
                          layer.values[row : row + 1, :, :length]) for layer in self.cache.layers)
        return tuple((layer.keys[row : row + 1].index_select(2, columns.to(layer.keys.device)),
                      layer.values[row : row + 1].index_select(2, columns.to(layer.keys.device)))
                     for layer in self.cache.layers)

    def remove_rows(self, rows: list[int]) -> None:
        """Drop the given rows (finished or cancelled requests); their memory is freed."""
        if not rows:
            return
        keep = [r for r in range(self.rows) if r not in set(rows)]
        if not keep:
            self.clear()
            return
        index = torch.tensor(keep, dtype=torch.long)
        for layer in self.cache.layers:
            on_device = index.to(layer.keys.device)
            layer.keys = layer.keys.index_select(0, on_device)
            layer.values = layer.values.index_select(0, on_device)
        self.valid = self.valid.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        self._trim()

    def clear(self) -> None:
        self.cache = None
        self.valid = torch.zeros(0, 0, dtype=torch.bool)
        self.positions = torch.zeros(0, 0, dtype=torch.long)

    def run_step(self, model, layouts: list[StepLayout]) -> tuple[StepBatch, list[torch.Tensor]]:
        """One forward pass of ``model`` for every row's step: the rows' step inputs padded
        into one batch (``prepare_step``), the pass through the cache, the columns it appended
        recorded (``extend``), and the logits split back per row (``split_logits``).

        layouts[b]: row b's step input. Returns the batch and each row's logits [R_b, V] in
        its layout's order. The caller verifies each row, then calls ``keep(batch.width,
        kept)``; removing finished rows and compacting are the caller's policy.
        """
        if self.keyword is None:
            self.keyword = cache_keyword(model)
        batch = self.prepare_step(model.config, layouts, model.dtype)
        out = decoding_pass(model, self.keyword, self.cache, input_ids=batch.input_ids,
                            position_ids=batch.position_ids, attention_mask=batch.mask,
                            logits_to_keep=batch.logit_rows)
        self.extend(batch.position_ids)
        return batch, self.split_logits(batch, out.logits)

    def prepare_step(self, config, layouts: list[StepLayout], dtype: torch.dtype) -> StepBatch:
        """Pad every request's step input to the longest and build the batched 4D mask.

        Row b's real tokens see its valid cached columns and, inside the step, what the layout's
        ``visible`` allows (a causal chain when None). Padding rows see only themselves.
        """
        batch, past = len(layouts), self.columns
        width = max(layout.input_ids.shape[1] for layout in layouts)
        input_ids = torch.zeros(batch, width, dtype=torch.long)
        position_ids = torch.zeros(batch, width, dtype=torch.long)
        allowed = torch.zeros(batch, width, past + width, dtype=torch.bool)
        logit_rows = torch.zeros(batch, width, dtype=torch.bool)
        order = []
        eye = torch.eye(width, dtype=torch.bool)
        for b, layout in enumerate(layouts):
            t = layout.input_ids.shape[1]
            input_ids[b, :t] = layout.input_ids[0]
            input_ids[b, t:] = layout.input_ids[0, 0]
            position_ids[b, :t] = layout.position_ids[0]
            position_ids[b, t:] = layout.position_ids[0, 0]
            visible = layout.visible
            if visible is None:
                visible = torch.tril(torch.ones(t, t, dtype=torch.bool))
            allowed[b, :t, :past] = self.valid[b]
            allowed[b, :t, past : past + t] = visible
            allowed[b, t:, past:] = eye[t:]
            rows = layout.logit_rows
            logit_rows[b, rows] = True
            order.append(torch.searchsorted(torch.unique(rows), rows))
        key_positions = torch.cat([self.positions, position_ids], dim=1)
        mask = batched_attention_mask(config, allowed, position_ids, key_positions, dtype)
        device = self.device
        return StepBatch(input_ids.to(device), position_ids.to(device), mask_to(mask, device),
                         logit_rows.to(device), [o.to(device) for o in order])

    def split_logits(self, batch: StepBatch, logits: torch.Tensor) -> list[torch.Tensor]:
        """The model's logits for ``batch.logit_rows`` -> per request [R_b, V] in layout order.

        ``logits`` is flat [N, V] (rows in row-major order of the bool mask) or, for a model
        that ignores a 2D ``logits_to_keep``, [B, T, V].
        """
        if logits.dim() == 3:
            logits = logits[batch.logit_rows]
        counts = batch.logit_rows.sum(dim=1).tolist()
        out, start = [], 0
        for count, order in zip(counts, batch.order):
            out.append(logits[start : start + count][order])
            start += count
        return out

    def extend(self, position_ids: torch.Tensor) -> None:
        """Record the T columns the forward pass appended to every row, invalid for now."""
        batch, width = position_ids.shape
        self.valid = torch.cat([self.valid, torch.zeros(batch, width, dtype=torch.bool)], dim=1)
        self.positions = torch.cat([self.positions, position_ids.to(self.positions.device)], dim=1)

    def keep(self, width: int, kept: list[list[int]]) -> None:
        """After a step of ``width`` columns, keep row b's step entries ``kept[b]`` (indices
        into the step's columns, increasing): each row's kept entries move to the front of the
        step's columns, and the columns that no row needs any more are cut at once.

        A step thus leaves ``max(len(kept[b]))`` columns rather than ``width``, and only rows
        that keep fewer than the most leave waste for ``compact``. Alone, a request's cache
        stays as tight as in ``Decoder``'s own loop. The move touches the step's columns only.
        """
        start, keep = self.columns - width, max((len(rows) for rows in kept), default=0)
        counts = torch.tensor([len(rows) for rows in kept])
        self.valid[:, start:] = torch.arange(width).unsqueeze(0) < counts.unsqueeze(1)
        if any(rows != list(range(len(rows))) for rows in kept):
            index = torch.zeros(len(kept), keep, dtype=torch.long)  # padding: any column
            for b, rows in enumerate(kept):
                index[b, : len(rows)] = torch.tensor(rows, dtype=torch.long)
            for layer in self.cache.layers:
                heads, dim = layer.keys.shape[1], layer.keys.shape[3]
                gather = index.to(layer.keys.device)[:, None, :, None].expand(-1, heads, -1, dim)
                # gather copies before the write, and entries only move to lower columns.
                for entries in (layer.keys, layer.values):
                    entries[:, :, start : start + keep] = entries[:, :, start:].gather(2, gather)
            self.positions[:, start : start + keep] = self.positions[:, start:].gather(1, index)
        if keep < width:
            self._cut_columns(start + keep, copy=False)  # the next step's append copies anyway

    def wasted(self) -> float:
        """Fraction of columns the longest row does not need (what ``compact`` would save)."""
        if self.columns == 0:
            return 0.0
        return 1.0 - max(self.row_lengths()) / self.columns

    def compact(self) -> None:
        """Gather each row's valid columns to the left and cut the columns no row needs.

        Attention does not depend on the order of the keys (their positions are baked in by
        RoPE and the mask follows the entries), so rows keep their entries in column order.
        """
        lengths = self.row_lengths()
        width = max(lengths)
        # Valid columns first (stable), then the rest: a per-row gather index [B, width].
        index = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :width]
        for layer in self.cache.layers:
            gather = index.to(layer.keys.device)[:, None, :, None]
            gather = gather.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = layer.keys.gather(2, gather)
            layer.values = layer.values.gather(2, gather)
        self.valid = torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
        self.positions = self.positions.gather(1, index)

    def _pad_columns(self, width: int) -> None:
        extra = width - self.columns
        if extra <= 0:
            return
        for layer in self.cache.layers:
            layer.keys = _pad(layer.keys, width)
            layer.values = _pad(layer.values, width)
        self.valid = torch.nn.functional.pad(self.valid, (0, extra), value=False)
        self.positions = torch.nn.functional.pad(self.positions, (0, extra), value=0)

    def _trim(self) -> None:
        """Cut trailing columns that no row uses (after rows were removed)."""
        used = self.valid.any(dim=0).nonzero()
        width = int(used[-1]) + 1 if len(used) else 0
        if width != self.columns:
            self._cut_columns(width, copy=True)  # copies, so the cut columns' memory is freed

    def _cut_columns(self, width: int, copy: bool) -> None:
        """Keep the first ``width`` columns: views of the tensors, or copies if ``copy``."""
        for layer in self.cache.layers:
            keys, values = layer.keys[:, :, :width], layer.values[:, :, :width]
            if copy:
                keys, values = keys.contiguous(), values.contiguous()
            layer.keys, layer.values = keys, values
        self.valid = self.valid[:, :width]
        self.positions = self.positions[:, :width]


def _pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad [B, H, S, D] on the right of S to ``width`` columns (zeros are never attended)."""
    extra = width - tensor.shape[2]
    if extra <= 0:
        return tensor
    return torch.nn.functional.pad(tensor, (0, 0, 0, extra))
