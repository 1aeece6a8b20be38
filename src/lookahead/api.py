"""The public entry points: ``generate``, ``custom_generate`` and ``stream``.

    inputs = tokenizer(["def fib(n):", "The cache"], return_tensors="pt", padding=True)
    result = lookahead.generate(model, **inputs, max_new_tokens=64, method="lookahead")
    result.sequences  # [2, W + T], padded as model.generate pads them

    # Or leave the call as it is and let model.generate hand the decoding to lookahead:
    out = model.generate(**inputs, max_new_tokens=64, custom_generate=lookahead.custom_generate)

``generate`` takes what ``model.generate`` takes. Settings come from ``generation_config``, else
the model's own ``generation_config``, then transformers' defaults, merged by transformers
itself (``lookahead.hf_settings``); its logits processors (repetition penalty, n-gram bans,
min_new_tokens, warpers, custom ``logits_processor``) are applied at every verified position
and its stopping criteria (EOS, max_length, stop_strings, max_time, custom
``stopping_criteria``) after every token (see ``lookahead.controls``). What cannot be honoured
(beam search, contrastive search, scores and attentions in the output, ...) is refused by
name. Caching settings (``use_cache``, ``cache_implementation``) do not change the tokens and
are left to our own cache. One request's ``Decoder`` is built by ``lookahead.request``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import Cache, GenerationConfig
from transformers.generation import logits_process as lp
from transformers.generation.stopping_criteria import StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from lookahead.batch import decode_batch, left_padding, merge_stats, plan_rows
from lookahead.config import SamplingConfig, check_int, method_spec
from lookahead.decode import Decoder
from lookahead.prefix_cache import CachedPrefix
from lookahead.hf_settings import (SAMPLING_FIELDS, check_mode, our_options, prepare_config,
                                   split_warpers)
from lookahead.request import check_input_ids, make_decoder
from lookahead.stats import GenerationStats

logger = logging.getLogger(__name__)

_UNSET = object()

@dataclass(frozen=True)
class GenerationResult:
    """sequences: LongTensor [B, prompt_len + new_tokens]; stats: what the decoding did (all
    rows together); row_stats: each row's, for a batch (else empty); past_key_values: for a
    batch of one, the KV cache of ``sequences[:, :-1]``, to continue from (pass it back as
    ``past_key_values=`` with a prompt that extends the text), else None."""

    sequences: torch.Tensor
    stats: GenerationStats
    row_stats: tuple[GenerationStats, ...] = ()
    past_key_values: Cache | None = None

    @property
    def new_tokens(self) -> torch.Tensor:
        """LongTensor [B, new_tokens]."""
        return self.sequences[:, self.stats.prompt_tokens :]


class Stream:
    """Iterate to get the tokens committed at each step (list[int]); ``stats`` fills as it goes."""

    def __init__(self, decoder: Decoder) -> None:
        self._decoder = decoder

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._decoder)

    @property
    def stats(self) -> GenerationStats:
        return self._decoder.stats

    @property
    def sequences(self) -> torch.Tensor:
        return torch.tensor([self._decoder.context], dtype=torch.long)

    @property
    def past_key_values(self) -> Cache:
        """The KV cache of the text so far but its last token (once a step has ended), to
        continue from as ``generate``'s or ``stream``'s ``past_key_values``."""
        return self._decoder.cache


def stream(model, input_ids, max_new_tokens: int = 256, method: str = "lookahead", *,
           past_key_values: Cache | None = None, **options):
    """Like ``generate`` but returns a ``Stream`` that yields each step's tokens as decoded
    (``input_ids``: LongTensor [1, prompt_len]; ``past_key_values`` as for ``generate``)."""
    if past_key_values is not None:
        options["prefix"] = _prefix_of(past_key_values, input_ids, None)
    return Stream(make_decoder(model, input_ids, max_new_tokens, method, **options))


def generate(model, input_ids=None, max_new_tokens=_UNSET, method: str = "lookahead", *,
             attention_mask=None, generation_config: GenerationConfig | None = None,
             streamer=None, stop_strings=None, tokenizer=None, logits_processor=None,
             stopping_criteria=None, prefix_allowed_tokens_fn=None,
             batched: bool | None = None, past_key_values: Cache | None = None,
             cache: Cache | None = None, **kwargs):
    """Decode ``input_ids`` (LongTensor [B, W]) with ``method``; returns a ``GenerationResult``.

    Takes what ``model.generate`` takes -- ``**tokenizer(texts, return_tensors="pt")``
    (``attention_mask``: left padding for a batch), ``generation_config``, its fields as
    keywords (``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``,
    ``no_repeat_ngram_size``, ``min_new_tokens``, ``eos_token_id``, ``pad_token_id``,
    ``max_length``, ...), ``streamer`` (batch of one), ``stop_strings`` with ``tokenizer``,
    ``logits_processor``, ``stopping_criteria``, ``prefix_allowed_tokens_fn`` -- with the
    same meaning and defaults (the model's ``generation_config``), and the output is
    ``model.generate``'s: greedy decoding gives its tokens exactly. Beside them: ``method``
    and its options (``docs/methods.md``; checked by ``lookahead.request.make_decoder``), ``seed`` for sampling. Without any
    ``max_new_tokens``/``max_length`` setting 256 tokens are written.

    ``sequences``: [B, W + T], rows that end early padded with ``pad_token_id``;
    ``new_tokens``: [B, T]; ``stats``: all rows together (``row_stats``: each row's).
    ``batched``: the rows of a batch share each step's forward pass (True) or run one after
    another (False); None: together on an accelerator, apart on the CPU. Apart, each row's
    tokens are exactly those it gets alone; together, a batched pass may round a near-tie
    differently in low precision, as ``model.generate``'s own batches do.
    ``past_key_values`` (or ``cache``, its name since transformers 5.24; batch of one): a
    cache holding the KV entries of ``input_ids``' first
    tokens, e.g. an earlier result's ``past_key_values`` when ``input_ids`` extends that
    text (a chat's next turn); only the tokens after them are prefilled. As with
    ``model.generate``, the cache must be of those very tokens.
    """
    if isinstance(max_new_tokens, GenerationConfig) and generation_config is None:
        generation_config, max_new_tokens = max_new_tokens, _UNSET  # model.generate's order
    if input_ids is None:
        input_ids = kwargs.pop("inputs", None)
    method_spec(method)  # an unknown method is refused before anything else
    check_input_ids(input_ids)
    ours = our_options()
    options = {name: kwargs.pop(name) for name in list(kwargs) if name in ours}
    if past_key_values is not None or cache is not None:
        options["prefix"] = _prefix_of(past_key_values if cache is None else cache, input_ids,
                                       attention_mask)
    if "assistant_model" in kwargs:
        raise ValueError("assistant_model: use method='draft' with draft_model=<the model>")
    if max_new_tokens is not _UNSET:
        kwargs["max_new_tokens"] = check_int("max_new_tokens", max_new_tokens, 1, 1 << 30)
    if stop_strings is not None:
        kwargs["stop_strings"] = stop_strings
    # Our messages for bad sampling values come before transformers' own checks.
    SamplingConfig(**{k: kwargs[k] for k in SAMPLING_FIELDS if k in kwargs},
                   seed=options.get("seed"))
    pads = left_padding(input_ids, attention_mask)
    config = prepare_config(model, generation_config, kwargs, input_ids, attention_mask, method)
    processors = model._get_logits_processor(
        generation_config=config, input_ids_seq_length=input_ids.shape[1],
        encoder_input_ids=input_ids, prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
        logits_processor=lp.LogitsProcessorList(logits_processor or []), device=input_ids.device,
        model_kwargs={"attention_mask": attention_mask} if any(pads) else {},
    )
    # max_new_tokens goes in as a setting and comes back out of transformers' criteria as a
    # MaxLengthCriteria (prompt width + max_new_tokens, or the caller's max_length), which
    # plan_rows turns back into the per-row count a Decoder stops at: one limit, however the
    # caller expressed it, and the same one model.generate would apply.
    criteria = model._get_stopping_criteria(config, StoppingCriteriaList(stopping_criteria or []),
                                            tokenizer=tokenizer)
    processors, sampling = split_warpers(processors, config.do_sample)
    plan = plan_rows(processors, criteria, sampling, config._pad_token_tensor, input_ids.shape[1])
    sequences, stats, caches = decode_batch(model, input_ids, pads, plan, method, options,
                                            streamer, batched=batched)
    cache = caches[0] if len(caches) == 1 else None
    return GenerationResult(sequences, merge_stats(stats, input_ids.shape[1]), tuple(stats),
                            cache)


def custom_generate(model, input_ids, logits_processor=None, stopping_criteria=None,
                    generation_config=None, synced_gpus=False, streamer=None, **model_kwargs):
    """The decoding method for ``model.generate(..., custom_generate=lookahead.custom_generate)``.

        out = model.generate(**tokenizer(texts, return_tensors="pt", padding=True),
                             max_new_tokens=64, repetition_penalty=1.1,
                             custom_generate=lookahead.custom_generate,
                             method="lookahead", window=3)  # our options ride along

    transformers prepares everything (settings, processors, stopping criteria) and calls this
    with the prepared input_ids [B, W]; it decodes with ``method`` (default "lookahead") and
    its options, and returns what ``model.generate`` returns: LongTensor [B, W + T], or a
    ``GenerateDecoderOnlyOutput`` under ``return_dict_in_generate``. transformers 5.24 keeps
    ``streamer`` and ``tokenizer`` (so ``stop_strings``) from such a method: stream with
    ``lookahead.generate(..., streamer=)`` instead.
    """
    method = model_kwargs.pop("method", None) or "lookahead"
    method_spec(method)
    ours = our_options()
    options = {k: model_kwargs.pop(k) for k in list(model_kwargs) if k in ours}
    attention_mask = model_kwargs.pop("attention_mask", None)
    for name in ("cache", "past_key_values"):
        cache = model_kwargs.pop(name, None)
        if cache is not None and cache.get_seq_length() > 0:
            options["prefix"] = _prefix_of(cache, input_ids, attention_mask)
    for name in ("position_ids", "logits_to_keep", "use_cache", "cache_position"):
        model_kwargs.pop(name, None)  # derived from the mask, or choices about caching
    if model_kwargs:
        raise TypeError(f"custom_generate cannot pass {sorted(model_kwargs)} to the model")
    if synced_gpus:
        raise ValueError("synced_gpus cannot be honoured: lookahead decodes on one device")
    generation_config = generation_config or model.generation_config
    check_mode(generation_config, expanded=True)
    processors, sampling = split_warpers(logits_processor or [], generation_config.do_sample)
    pad = getattr(generation_config, "_pad_token_tensor", generation_config.pad_token_id)
    plan = plan_rows(processors, stopping_criteria or [], sampling, pad, input_ids.shape[1])
    pads = left_padding(input_ids, attention_mask)
    sequences, _, _ = decode_batch(model, input_ids, pads, plan, method, options, streamer,
                                put_prompt=False)  # model.generate has put the prompt
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def _prefix_of(cache, input_ids: torch.Tensor, attention_mask) -> CachedPrefix:
    """A caller's filled cache as the prefix of a one-row, unpadded ``input_ids`` [1, W]."""
    prefix = CachedPrefix.from_cache(cache)
    if input_ids.shape[0] != 1 or (attention_mask is not None and not bool(attention_mask.all())):
        raise ValueError("past_key_values: a filled cache continues one unpadded sequence, got "
                         f"input_ids of shape {list(input_ids.shape)}")
    if not 0 < prefix.length < input_ids.shape[1]:
        raise ValueError(f"past_key_values holds {prefix.length} positions: it must hold fewer "
                         f"than input_ids' {input_ids.shape[1]} tokens, and at least one")
    return prefix


def _custom_generate_signature() -> inspect.Signature:
    """``custom_generate``'s signature with every option of ours named: ``model.generate``
    passes a custom method only the extra keywords its signature names."""
    params = list(inspect.signature(custom_generate).parameters.values())
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
             for name in ("method", *sorted(our_options()))]
    return inspect.Signature(params[:-1] + extra + params[-1:])


custom_generate.__signature__ = _custom_generate_signature()
