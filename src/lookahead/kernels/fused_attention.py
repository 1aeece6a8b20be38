"""A quantized model's self-attention block with fewer calls: the rotary embedding of query
and key in one compiled call (``csrc/row_ops.cpp``), the attention function looked up once.

At one token a pass, what runs between a 1.5B model's linear layers was about 7 ms of a 38 ms
step, and the self-attention block was half of it: transformers applies the rotary embedding
in 14 PyTorch operations per layer (``rotate_half`` slices, negates and concatenates, for
the query and for the key), looks the attention function up in the config at every call and
goes through a deprecation wrapper. :func:`fuse_attention` swaps Llama-style attention
modules (separate q, k, v, o projections on :class:`QuantLinear`, no norms of their own, no
sliding window) for :class:`FusedAttention`, which does the same arithmetic in fewer calls.

The rotary call rounds each product, then the sum, as PyTorch does, so the block gives the
bits of the module it replaces: a module is swapped only where both give the same output and
the same cache entries, bit for bit, on a random input; anything else is left as it is.
"""

from __future__ import annotations

import inspect
import logging

import torch
from transformers import DynamicCache

from lookahead.kernels.quant_linear import QuantLinear
from lookahead.kernels.row_ops import (PlainCalls, load_row_ops, row_ops_problem,
                                       swap_children)

logger = logging.getLogger(__name__)

# Attention classes whose forward is "project, rotate, cache, attend, project" exactly.
KNOWN_CLASSES = ("LlamaAttention", "Qwen2Attention", "MistralAttention")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
# What the attention function reads from the module it is given (transformers' functions).
COPIED = ("config", "layer_idx", "head_dim", "num_key_value_groups", "scaling",
          "attention_dropout", "is_causal")


class FusedAttention(PlainCalls):
    """The self-attention block of ``module`` (see the module's text), on its own projections.

    Args:
        module: a Llama-style attention module whose projections are :class:`QuantLinear`.
        attend: the attention function, transformers' signature (``AttentionInterface``).
    """

    def __init__(self, module: torch.nn.Module, attend) -> None:
        super().__init__()
        for name in PROJECTIONS:
            setattr(self, name, getattr(module, name))
        for name in COPIED:
            setattr(self, name, getattr(module, name))
        self.sliding_window = getattr(module, "sliding_window", None)
        # Qwen2 and Mistral hand their sliding window to the function, Llama nothing
        self._extra = {"sliding_window": None} if hasattr(module, "sliding_window") else {}
        self._attend = attend
        self._rotary = load_row_ops().rotary  # the builtin: deepcopy keeps it
        self._bind()

    def _bind(self) -> None:
        self._calls = tuple(getattr(self, name).kernel_call() for name in PROJECTIONS)

    def forward(self, hidden_states: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None, cache=None,
                past_key_values=None, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states [B, T, hidden], position_embeddings (cos, sin) [B, T, D] -> the block's
        output [B, T, hidden] and the attention function's weights (None here)."""
        cache = past_key_values if cache is None else cache  # the name before 5.24
        lead = hidden_states.shape[:-1]
        out, weights = self.attend_rows(hidden_states.reshape(-1, hidden_states.shape[-1]),
                                        lead, position_embeddings, attention_mask, cache,
                                        kwargs)
        return out.view(*lead, out.shape[-1]), weights

    def attend_rows(self, rows: torch.Tensor, lead: torch.Size,
                    position_embeddings: tuple[torch.Tensor, torch.Tensor],
                    attention_mask: torch.Tensor | None, cache, kwargs: dict
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block on the rows [B * T, hidden] of hidden states [B, T, hidden] (``lead`` is
        (B, T)) -> [B * T, hidden] and the attention function's weights (None from the
        row-invariant one). ``kwargs`` go to the cache and the attention function."""
        (q_proj, q_args), (k_proj, k_args), (v_proj, v_args), (o_proj, o_args) = self._calls
        shape = (*lead, -1, self.head_dim)  # [B, T, heads, D]
        cos, sin = position_embeddings
        query, key = self._rotary(q_proj(rows, *q_args).view(shape),
                                  k_proj(rows, *k_args).view(shape),
                                  cos.contiguous(), sin.contiguous())
        query, key = query.transpose(1, 2), key.transpose(1, 2)  # [B, heads, T, D] views
        value = v_proj(rows, *v_args).view(shape).transpose(1, 2)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
        out, weights = self._attend(self, query, key, value, attention_mask, dropout=0.0,
                                    scaling=self.scaling, **self._extra, **kwargs)
        return o_proj(out.reshape(rows.shape[0], -1), *o_args), weights


def fuse_attention(model: torch.nn.Module, attend) -> int:
    """Swap ``model``'s Llama-style attention modules for :class:`FusedAttention` on the
    attention function ``attend``, where each gives the same bits (see the module's text).
    Returns how many were swapped (none where the kernel cannot be built: logged)."""
    problem = row_ops_problem()
    if problem is not None:
        logger.info("attention blocks left as they are: %s", problem)
        return 0
    swapped = len(swap_children(model, lambda child: _fused(child, attend)))
    logger.info("fused attention: %d blocks swapped", swapped)
    return swapped


def _fused(module: torch.nn.Module, attend) -> FusedAttention | None:
    """A ``FusedAttention`` that computes what ``module`` does, or None."""
    if (type(module).__name__ not in KNOWN_CLASSES
            or set(dict(module.named_children())) != set(PROJECTIONS)
            or not all(isinstance(getattr(module, name), QuantLinear) for name in PROJECTIONS)
            or getattr(module, "sliding_window", None) is not None
            or not all(hasattr(module, name) for name in COPIED)):
        return None
    new = FusedAttention(module, attend)
    return new if _same_bits(module, new) else None


def _same_bits(old: torch.nn.Module, new: FusedAttention) -> bool:
    """Whether ``old`` and ``new`` give the same output and cache entries on a random input:
    3 tokens after 2 cached ones, causal."""
    generator = torch.Generator().manual_seed(0)
    hidden = old.q_proj.in_features
    states = torch.randn(1, 5, hidden, generator=generator)
    angles = torch.randn(1, 5, new.head_dim, generator=generator)
    cos, sin = angles.cos(), angles.sin()
    results = []
    with torch.no_grad():
        for module in (old, new):
            cache = DynamicCache()
            for part in (slice(0, 2), slice(2, 5)):
                out, _ = module(states[:, part], (cos[:, part], sin[:, part]), None,
                                **{cache_keyword_of(old): cache})
            layer = cache.layers[old.layer_idx]
            results.append((out, layer.keys, layer.values))
    return all(torch.equal(a, b) for a, b in zip(*results))


def cache_keyword_of(module: torch.nn.Module) -> str:
    """The keyword of the cache in ``module``'s forward: "cache" from transformers 5.24."""
    parameters = inspect.signature(type(module).forward).parameters
    return "past_key_values" if "past_key_values" in parameters else "cache"
