"""Decoding a (left-padded) batch as ``model.generate`` does, with processors and criteria.

Each row is decoded stripped of its padding, with its own proposer, statistics and stopping
point; the rows are then padded back as ``model.generate`` pads them: the prompts as given,
and after a row's EOS ``pad_token_id`` up to the longest row. A row decoded alone is the row
``model.generate`` decodes in the batch (its padding is masked out there, and its positions
start at its first real token), so the output is the same token for token.

The rows run either together, each step of every row in one forward pass over a batched KV
cache (``lookahead.batch_cache``, the server's), or one after another (``batched=False``, and
for long-RoPE models, whose cache is recomputed at a switch point one request at a time).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import torch

from lookahead.batch_cache import BatchedCache
from lookahead.controls import Controls, row_processors, split_criteria
from lookahead.kernels.invariant_attention import rows_are_independent
from lookahead.request import describe, make_decoder
from lookahead.stats import GenerationStats

logger = logging.getLogger(__name__)


def left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[int]:
    """Per row of ``input_ids`` [B, W], how many leading positions ``attention_mask`` [B, W]
    masks out. Only left padding (zeros, then ones) can be decoded; anything else is refused."""
    batch, width = input_ids.shape
    if attention_mask is None:
        return [0] * batch
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != (batch, width):
        raise ValueError(f"attention_mask must be a tensor of input_ids' shape {[batch, width]}, "
                         f"got {describe(attention_mask)}")
    mask = attention_mask.detach().to("cpu", torch.long)
    if not ((mask == 0) | (mask == 1)).all():
        raise ValueError("attention_mask must hold only 0 and 1")
    pads = []
    for row in range(batch):
        ones = int(mask[row].sum())
        if ones == 0:
            raise ValueError(f"attention_mask row {row} masks every token: a prompt needs one")
        if not bool(mask[row, width - ones :].all()):
            raise ValueError(
                f"attention_mask row {row} is not left padding (zeros, then ones): pad decoder "
                "prompts on the left (tokenizer.padding_side = 'left')"
            )
        pads.append(width - ones)
    return pads


@dataclasses.dataclass
class RowPlan:
    """What every row of one call shares: how tokens are chosen, stopped and padded.

    processors / criteria: the call's ``LogitsProcessorList`` and the criteria ``Decoder``
    does not apply itself; sampling: ``make_decoder``'s sampling options (the warpers it
    applies itself); eos: EOS ids; max_new_tokens: per row; pad_token_id: what fills a row
    that ended early (None: rows cannot end early).
    """

    processors: Sequence
    criteria: Sequence
    sampling: dict
    eos: list[int]
    max_new_tokens: int
    pad_token_id: int | None


def plan_rows(processors, criteria, sampling: dict, pad_token_id, width: int,
              max_new_tokens: int | None = None) -> RowPlan:
    """A ``RowPlan`` from transformers' prepared processors and criteria for inputs ``width``
    tokens wide (the token limit comes from a ``MaxLengthCriteria`` unless given)."""
    max_length, eos, others = split_criteria(criteria)
    if max_new_tokens is None:
        if max_length is None:
            raise ValueError("generation needs max_new_tokens or max_length")
        max_new_tokens = max_length - width
    pad = None
    if eos is not None:  # model.generate pads a row after its EOS only when there is one
        pad = int(pad_token_id) if pad_token_id is not None else eos[0]
    return RowPlan(processors, others, sampling, eos or [], max_new_tokens, pad)


def decode_batch(model, input_ids: torch.Tensor, pads: list[int], plan: RowPlan, method: str,
                 options: dict, streamer=None, put_prompt: bool = True,
                 batched: bool | None = None):
    """Decode every row of ``input_ids`` [B, W] (row b after its ``pads[b]`` padding tokens).

    Returns (sequences [B, W + T] on ``input_ids``' device, the rows' ``GenerationStats``,
    the rows' KV caches: each covers its row but the last token, None where the rows ran
    together).
    ``streamer`` (batch of one only) gets the prompt (unless ``put_prompt`` is False), then
    each token, then ``end()``. ``batched``: rows in one forward pass per step (True), or
    one after another (False); None: together for several rows on an accelerator or where
    each row's pass is independent of the others' (the quantized path,
    ``rows_are_independent``), apart otherwise on the CPU. There, with float weights, a pass
    of B rows cost about B passes of one (SmolLM2-135M bf16, 4 prompts, 2 cores: no gain) and
    a batched pass can round a near-tie differently from the row's own pass; on the quantized
    path 4 prompts together ran 1.20x (lookahead) and 2.47x (autoregressive) the 4 calls,
    with the same tokens (``benchmarks/batch_generate.py``).
    """
    batch = input_ids.shape[0]
    if streamer is not None and batch > 1:
        raise ValueError(f"streamer takes one sequence; got a batch of {batch}")
    if batch > 1 and plan.pad_token_id is None and plan.criteria:
        raise ValueError("stopping a row of a batch early (stop_strings, stopping_criteria) needs "
                         "an eos_token_id or pad_token_id to pad it with")
    if streamer is not None and put_prompt:
        streamer.put(input_ids.cpu())
    decoders = [_row_decoder(model, input_ids, row, pads[row], plan, method, options, batch)
                for row in range(batch)]
    if batched is None:
        batched = batch > 1 and (model.device.type != "cpu" or rows_are_independent(model))
    if batched and decoders[0].rope_switch is None:
        decode_together(model, decoders)
    else:
        for decoder in decoders:
            for committed in decoder:
                if streamer is not None:
                    for token in committed:
                        streamer.put(torch.tensor([token]))
    if streamer is not None:
        streamer.end()
    rows = [decoder.new_tokens for decoder in decoders]
    return (pad_rows(input_ids, rows, plan.pad_token_id), [d.stats for d in decoders],
            [d.cache for d in decoders])


@torch.inference_mode()
def decode_together(model, decoders: list, compact_waste: float = 0.5) -> None:
    """Run ``decoders`` (made, not started) to their ends, every running one's step in one
    forward pass over a batched KV cache, as the server's engine does.

    Each prompt is prefilled alone; its cache then becomes a row of the batch. A row that
    finishes leaves the batch. When over ``compact_waste`` of the cache's columns are gaps
    that rows left, the rows are compacted.
    """
    start = time.perf_counter()
    cache, running = BatchedCache(), []
    for decoder in decoders:
        decoder.prefill()
        decoder.stats.time_to_first_token = decoder.stats.seconds = time.perf_counter() - start
        if not decoder.finished:
            cache.add_row(decoder.cache)
            decoder.cache = None  # the batch owns its entries now
            running.append(decoder)
    while running:
        plans = [d.plan(len(d.context) - 1) for d in running]  # past: all but x0
        step, row_logits = cache.run_step(model, [p.layout for p in plans])
        kept, done = [], []
        for row, (decoder, plan, logits) in enumerate(zip(running, plans, row_logits)):
            _, keep = decoder.finish(plan, logits)
            kept.append(keep)
            decoder.stats.seconds = time.perf_counter() - start
            if decoder.finished:
                done.append(row)
        cache.keep(step.width, kept)
        running = [d for row, d in enumerate(running) if row not in done]
        if not running:
            break
        cache.remove_rows(done)
        if cache.wasted() > compact_waste:
            cache.compact()


def _row_decoder(model, input_ids, row: int, pad: int, plan: RowPlan, method, options, batch):
    prefix = input_ids[row, :pad].tolist()
    processors = row_processors(plan.processors, row, batch)
    controls = None
    if processors or plan.criteria:
        controls = Controls(processors, plan.criteria, prefix, device=input_ids.device)
    options = dict(options)
    if row and options.get("seed") is not None:  # rows draw different samples, reproducibly
        options["seed"] = (options["seed"] + row) % (1 << 63)
    return make_decoder(model, input_ids[row : row + 1, pad:], plan.max_new_tokens, method,
                        controls=controls, eos_token_id=plan.eos, **plan.sampling, **options)


def pad_rows(input_ids: torch.Tensor, rows: list[list[int]], pad_token_id: int | None):
    """``input_ids`` [B, W] followed by each row's new tokens, padded with ``pad_token_id`` to
    the longest: LongTensor [B, W + T]."""
    batch, width = input_ids.shape
    longest = max(len(r) for r in rows)
    if pad_token_id is None and any(len(r) != longest for r in rows):
        raise ValueError("rows ended at different lengths but there is no pad_token_id")
    out = torch.full((batch, width + longest), pad_token_id if pad_token_id is not None else 0,
                     dtype=torch.long, device=input_ids.device)
    out[:, :width] = input_ids
    for b, tokens in enumerate(rows):
        out[b, width : width + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    return out


def merge_stats(stats: list[GenerationStats], width: int) -> GenerationStats:
    """One ``GenerationStats`` for rows decoded one after another: counts and times add up,
    per-step lists are concatenated, and ``prompt_tokens`` is the padded width."""
    if len(stats) == 1 and stats[0].prompt_tokens == width:
        return stats[0]
    merged = GenerationStats(method=stats[0].method, prompt_tokens=width)
    for s in stats:
        merged.new_tokens += s.new_tokens
        merged.steps += s.steps
        merged.seconds += s.seconds
        merged.accepted_per_step += s.accepted_per_step
        merged.proposed_per_step += s.proposed_per_step
        merged.forward_tokens_per_step += s.forward_tokens_per_step
        for k, count in enumerate(s.accepted_per_position):
            if k == len(merged.accepted_per_position):
                merged.accepted_per_position.append(0)
            merged.accepted_per_position[k] += count
    merged.time_to_first_token = stats[0].time_to_first_token
    return merged

