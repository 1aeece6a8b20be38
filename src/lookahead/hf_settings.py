"""Transformers' generation settings, turned into what lookahead decodes with.

``lookahead.generate`` and ``custom_generate`` (``lookahead.api``) take what ``model.generate``
takes. Here transformers itself merges those settings (``prepare_config``), the decoding modes
we cannot reproduce are refused by name (``check_mode``), and the sampling warpers that the
verifier computes itself are taken out of the processor list (``split_warpers``).
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig
from transformers.generation import logits_process as lp
from transformers.generation.configuration_utils import GenerationMode

from lookahead.config import method_spec, options_by_method

SAMPLING_FIELDS = ("do_sample", "temperature", "top_k", "top_p")
# Without max_new_tokens or max_length anywhere (model.generate would write 20 tokens).
DEFAULT_MAX_NEW_TOKENS = 256

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


def our_options() -> frozenset[str]:
    """Our keyword options (every method's, and the sampling seed), told apart from
    transformers' settings."""
    return frozenset({"seed", *(name for names in options_by_method().values() for name in names)})




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
            f"{list(method_spec(method).options) or 'none'} besides seed and GenerationConfig's "
            "fields"
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
