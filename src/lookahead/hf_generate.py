"""``generate`` in transformers' terms, and ``custom_generate`` for ``model.generate``.

    inputs = tokenizer(["def fib(n):", "The cache"], return_tensors="pt", padding=True)
    result = lookahead.generate(model, **inputs, max_new_tokens=64, method="lookahead")
    result.sequences  # [2, W + T], padded as model.generate pads them

    # Or leave the call as it is and let model.generate hand the decoding to lookahead:
    out = model.generate(**inputs, max_new_tokens=64, custom_generate=lookahead.custom_generate)

Settings come from ``generation_config``, else the model's own ``generation_config``, then
transformers' defaults, merged by transformers itself; its logits processors (repetition
penalty, n-gram bans, min_new_tokens, warpers, custom ``logits_processor``) are applied at
every verified position and its stopping criteria (EOS, max_length, stop_strings, max_time,
custom ``stopping_criteria``) after every token (see ``lookahead.controls``). What cannot be
honoured (beam search, contrastive search, scores and attentions in the output, ...) is
refused by name. Caching settings (``use_cache``, ``cache_implementation``) do not change
the tokens and are left to our own cache.
"""

from __future__ import annotations

import inspect

import torch
from transformers import GenerationConfig
from transformers.generation import logits_process as lp
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.stopping_criteria import StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from lookahead.api import METHOD_OPTIONS, GenerationResult
from lookahead.batch import decode_batch, left_padding, merge_stats, plan_rows
from lookahead.config import METHODS, SamplingConfig, check_int

# Our keyword options (every method's, and the sampling seed), told apart from transformers'.
OUR_OPTIONS = frozenset({"seed", *(name for names in METHOD_OPTIONS.values() for name in names)})
SAMPLING_FIELDS = ("do_sample", "temperature", "top_k", "top_p")
# Without max_new_tokens or max_length anywhere (model.generate would write 20 tokens).
DEFAULT_MAX_NEW_TOKENS = 256

_UNSET = object()

# The settings that ask model.generate for a decoding mode other than greedy or sampling.
_MODE_SETTINGS = {
    GenerationMode.BEAM_SEARCH: "num_beams > 1 (beam search)",
    GenerationMode.BEAM_SAMPLE: "num_beams > 1 (beam search)",
    GenerationMode.GROUP_BEAM_SEARCH: "num_beam_groups > 1 (group beam search)",
    GenerationMode.CONSTRAINED_BEAM_SEARCH: "constraints / force_words_ids (constrained beam search)",
    GenerationMode.CONTRASTIVE_SEARCH: "penalty_alpha (contrastive search)",
    GenerationMode.DOLA_GENERATION: "dola_layers (DoLa decoding)",
    GenerationMode.ASSISTED_GENERATION:
        "prompt_lookup_num_tokens / assistant_model (use method='prompt_lookup', or "
        "method='draft' with draft_model=)",
}
_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states",
            "token_healing")


def generate(model, input_ids=None, max_new_tokens=_UNSET, method: str = "lookahead", *,
             attention_mask=None, generation_config: GenerationConfig | None = None,
             streamer=None, stop_strings=None, tokenizer=None, logits_processor=None,
             stopping_criteria=None, prefix_allowed_tokens_fn=None,
             batched: bool | None = None, **kwargs):
    """Decode ``input_ids`` (LongTensor [B, W]) with ``method``; returns a ``GenerationResult``.

    Takes what ``model.generate`` takes -- ``**tokenizer(texts, return_tensors="pt")``
    (``attention_mask``: left padding for a batch), ``generation_config``, its fields as
    keywords (``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``,
    ``no_repeat_ngram_size``, ``min_new_tokens``, ``eos_token_id``, ``pad_token_id``,
    ``max_length``, ...), ``streamer`` (batch of one), ``stop_strings`` with ``tokenizer``,
    ``logits_processor``, ``stopping_criteria``, ``prefix_allowed_tokens_fn`` -- with the
    same meaning and defaults (the model's ``generation_config``), and the output is
    ``model.generate``'s: greedy decoding gives its tokens exactly. Beside them: ``method``
    and its options (``docs/methods.md``; checked by ``lookahead.api.make_decoder``), ``seed`` for sampling. Without any
    ``max_new_tokens``/``max_length`` setting 256 tokens are written.

    ``sequences``: [B, W + T], rows that end early padded with ``pad_token_id``;
    ``new_tokens``: [B, T]; ``stats``: all rows together (``row_stats``: each row's).
    ``batched``: the rows of a batch share each step's forward pass (True) or run one after
    another (False); None: together on an accelerator, apart on the CPU. Apart, each row's
    tokens are exactly those it gets alone; together, a batched pass may round a near-tie
    differently in low precision, as ``model.generate``'s own batches do.
    """
    if isinstance(max_new_tokens, GenerationConfig) and generation_config is None:
        generation_config, max_new_tokens = max_new_tokens, _UNSET  # model.generate's order
    if input_ids is None:
        input_ids = kwargs.pop("inputs", None)
    check_method(method)
    check_input_ids(input_ids)
    options = {name: kwargs.pop(name) for name in list(kwargs) if name in OUR_OPTIONS}
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
    criteria = model._get_stopping_criteria(config, StoppingCriteriaList(stopping_criteria or []),
                                            tokenizer=tokenizer)
    processors, sampling = split_warpers(processors, config.do_sample)
    plan = plan_rows(processors, criteria, sampling, config._pad_token_tensor, input_ids.shape[1])
    sequences, stats = decode_batch(model, input_ids, pads, plan, method, options, streamer,
                                    batched=batched)
    return GenerationResult(sequences, merge_stats(stats, input_ids.shape[1]), tuple(stats))


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
    check_method(method)
    options = {k: model_kwargs.pop(k) for k in list(model_kwargs) if k in OUR_OPTIONS}
    attention_mask = model_kwargs.pop("attention_mask", None)
    for name in ("cache", "past_key_values"):
        cache = model_kwargs.pop(name, None)
        if cache is not None and cache.get_seq_length() > 0:
            raise ValueError(f"{name}: lookahead starts from the prompt, not from a filled cache")
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
    sequences, _ = decode_batch(model, input_ids, pads, plan, method, options, streamer,
                                put_prompt=False)  # model.generate has put the prompt
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def _custom_generate_signature() -> inspect.Signature:
    """``custom_generate``'s signature with every option of ours named: ``model.generate``
    passes a custom method only the extra keywords its signature names."""
    params = list(inspect.signature(custom_generate).parameters.values())
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
             for name in ("method", *sorted(OUR_OPTIONS))]
    return inspect.Signature(params[:-1] + extra + params[-1:])


custom_generate.__signature__ = _custom_generate_signature()


def prepare_config(model, generation_config, kwargs: dict, input_ids: torch.Tensor,
                   attention_mask, method: str) -> GenerationConfig:
    """The settings ``model.generate`` would decode ``input_ids`` [B, W] with, merged and
    completed by transformers itself (special tokens as tensors, ``max_length`` set)."""
    if not hasattr(model, "_prepare_generation_config"):
        raise TypeError(f"model must be a transformers generative model, got {type(model).__name__}")
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(f"generation_config must be a transformers.GenerationConfig, got "
                        f"{type(generation_config).__name__}")
    own = model.generation_config

    def unset(name):
        return kwargs.get(name) is None and getattr(generation_config, name, None) is None \
            and getattr(own, name, None) is None

    default_max, default_min = unset("max_length"), unset("min_length")
    config, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    if model_kwargs:
        raise TypeError(
            f"unknown option(s) {sorted(model_kwargs)} for method {method!r}; it takes "
            f"{list(METHOD_OPTIONS[method]) or 'none'} besides seed and GenerationConfig's fields"
        )
    check_mode(config)
    if default_max and config.max_new_tokens is None:
        config.max_new_tokens = DEFAULT_MAX_NEW_TOKENS
    batch, width = input_ids.shape
    model._prepare_special_tokens(config, attention_mask is not None, device=input_ids.device,
                                  batch_size=batch)
    return model._prepare_generated_length(config, default_max, default_min, "input_ids", width,
                                           input_ids)


def check_mode(config: GenerationConfig, expanded: bool = False) -> None:
    """Refuse, by name, every setting whose decoding we cannot reproduce.

    ``expanded``: transformers has already repeated each row ``num_return_sequences`` times.
    """
    mode = config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        raise ValueError(f"{_MODE_SETTINGS.get(mode, mode)} cannot be honoured: lookahead "
                         "decodes greedily or by sampling")
    for name in _OUTPUTS:
        if getattr(config, name, None):
            raise ValueError(f"{name}=True cannot be honoured by lookahead's generate")
    if not expanded and (config.num_return_sequences or 1) > 1:
        raise ValueError("num_return_sequences > 1 cannot be honoured here: repeat the prompt "
                         "rows instead (or use model.generate with custom_generate)")


def check_method(method) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")


def check_input_ids(input_ids) -> None:
    """A LongTensor [B, W] with B, W >= 1 (the ids themselves are checked per row)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.long:
        kind = (f"a {input_ids.dtype} tensor" if isinstance(input_ids, torch.Tensor)
                else type(input_ids).__name__)
        raise TypeError(f"input_ids must be a LongTensor [batch, prompt_len], got {kind}")
    if input_ids.dim() != 2 or 0 in input_ids.shape:
        raise ValueError(f"input_ids must have shape [batch, prompt_len] with at least one "
                         f"token, got {list(input_ids.shape)}")


def split_warpers(processors, do_sample: bool) -> tuple[lp.LogitsProcessorList, dict]:
    """(the processors ``Controls`` applies, ``make_decoder``'s sampling options).

    The temperature / top-k / top-p warpers transformers puts last when sampling are what
    ``lookahead.verify.warp`` computes, for every tree row at once and for a draft model's
    proposals too, so they are taken over; everything before them stays a processor.
    """
    rest = list(processors)
    sampling: dict = {"do_sample": bool(do_sample)}
    if not do_sample:
        return lp.LogitsProcessorList(rest), sampling
    minus_inf = -float("inf")
    takers = (
        (lp.TopPLogitsWarper, "top_p",
         lambda w: w.filter_value == minus_inf and w.min_tokens_to_keep == 1),
        (lp.TopKLogitsWarper, "top_k", lambda w: w.filter_value == minus_inf),
        (lp.TemperatureLogitsWarper, "temperature", lambda w: True),
    )
    for kind, name, plain in takers:
        if rest and type(rest[-1]) is kind and plain(rest[-1]):
            sampling[name] = getattr(rest.pop(), name)
    return lp.LogitsProcessorList(rest), sampling
