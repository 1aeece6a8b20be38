"""Grouped-query attention over the cache as it is, for steps of several tokens.

In grouped-query attention each key/value head serves ``groups`` query heads. For a one-token
step transformers folds those query heads into the query axis (its ``pack_gqa``), so SDPA reads
the cached keys and values in place. For a step of T > 1 tokens under a mask -- every step of
ours -- it copies every cached key and value ``groups`` times instead (``repeat_kv``), in every
layer, at every step. On a CPU that copy dominated a batched step: with 16 requests on
SmolLM2-135M (9 query heads, 3 key/value heads) a step of 2 tokens each took ~1.7x one of 1
token, and with the fold ~1.3x.

``grouped_sdpa`` folds the query heads for any T::

    query [B, H, T, D] -> [B, H_kv, G * T, D]    row g * T + t: query head h_kv * G + g, token t
    mask  [B, 1, T, S] -> [B, 1, G * T, S]       the same mask rows, once per query head

Every query row meets the same keys, values and mask row as before, so the result is the
same (the queries move, the cache does not). Anything this does not cover -- no mask, one
group, attention with extra terms (position bias, soft-capping, sinks), dropout -- goes to
transformers' own SDPA function unchanged.

The function is added through transformers' ``AttentionInterface``, the public way to supply
an attention function; ``use_grouped_attention(model)`` switches a model from ``"sdpa"`` to it.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION_NAME = "lookahead_sdpa"

# Keyword arguments that change what attention computes; with any of them set, fall back.
_EXTRA_TERMS = ("position_bias", "softcap", "s_aux", "sinks", "cache")


def grouped_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Transformers' attention-function signature: query [B, H, T, D], key and value
    [B, H_kv, S, D], mask [B, 1, T, S] -> output [B, T, H, D] (and no attention weights)."""
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, length, _ = query.shape
    if not _foldable(groups, length, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    folded = query.reshape(batch, heads // groups, groups * length, query.shape[-1])
    mask = attention_mask.repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask,
                                                           scale=scaling)
    out = out.reshape(batch, heads, length, value.shape[-1])
    return out.transpose(1, 2).contiguous(), None


def _foldable(groups: int, length: int, mask: torch.Tensor | None, dropout: float,
              kwargs: dict) -> bool:
    """Whether ``grouped_sdpa`` computes this call itself (else transformers' SDPA does)."""
    if groups <= 1 or length <= 1 or dropout > 0.0:
        return False  # nothing to fold, or transformers folds it already (one token)
    if mask is None or mask.dim() != 4 or mask.shape[1] != 1:
        return False  # a causal flag or a per-head mask: nothing to gain / fold safely
    return all(kwargs.get(name) is None for name in _EXTRA_TERMS)


def use_grouped_attention(model) -> bool:
    """Switch ``model`` from transformers' ``"sdpa"`` attention to ``grouped_sdpa``; True if
    it did. Models on another implementation (eager, flash, ...) are left as they are.

    The output is the same; steps of several tokens get cheaper in models with grouped-query
    attention. ``lookahead.load_model`` calls this; call it yourself on a model you load.
    """
    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", ATTENTION_NAME):
        return False
    AttentionInterface.register(ATTENTION_NAME, grouped_sdpa)
    # The model builds its own masks for the calls we do not make (e.g. ``model.generate``):
    # the same as for "sdpa".
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
    return True
