"""A quantized model's decoder layer with its children's compiled calls made directly.

Once the norms, the MLP and the attention block are one compiled call each (``row_ops``,
``fused_attention``), what is left between a 1.5B model's linear layers is mostly nn.Module's
machinery: every child call is wrapped (hooks, a deprecation wrapper around the layer's
keywords, gradient checkpointing), and every parameter, buffer and child is found through
``__getattr__``. Over 28 layers that was about 2 ms of a one-token pass of ~35 ms (5.2 ms
against 3.3 ms with the linear layers replaced by stubs). :func:`fuse_layers` swaps
Llama-style decoder layers whose children are :class:`RowRMSNorm`, :class:`FusedAttention`
and :class:`GatedMLP` for a :class:`FusedDecoderLayer`, which calls the children's
``rows`` methods in the layer's order: norm, attention, residual, norm, MLP, residual.

The swapped layer is a subclass of the layer's own class, so that transformers still finds
it where it records the hidden states of every layer (``output_hidden_states``). A layer is
swapped only where both give the same output and the same cache entries, bit for bit, on a
random input; anything else is left as it is.
"""

from __future__ import annotations

import logging

import torch
from transformers import DynamicCache

from lookahead.kernels.fused_attention import FusedAttention, cache_keyword_of
from lookahead.kernels.row_ops import GatedMLP, PlainCalls, RowRMSNorm, swap_children

logger = logging.getLogger(__name__)

# Decoder layers whose forward is "norm, attend, add, norm, MLP, add" exactly.
KNOWN_CLASSES = ("LlamaDecoderLayer", "Qwen2DecoderLayer", "MistralDecoderLayer")
CHILDREN = {"input_layernorm": RowRMSNorm, "self_attn": FusedAttention,
            "post_attention_layernorm": RowRMSNorm, "mlp": GatedMLP}


class FusedDecoderLayer(PlainCalls):
    """The decoder layer ``layer`` (see the module's text) on its own children.

    Args:
        layer: a Llama-style decoder layer whose children are those of ``CHILDREN``.
    """

    def __init__(self, layer: torch.nn.Module) -> None:
        # nn.Module's own set-up only: the layer's class (a base of this one, see
        # fuse_layers) would build new children
        torch.nn.Module.__init__(self)
        for name, value in vars(layer).items():  # training, hidden_size, attention_type...
            if not name.startswith("_"):
                setattr(self, name, value)
        for name in CHILDREN:
            setattr(self, name, getattr(layer, name))
        self._bind()

    def _bind(self) -> None:
        self._parts = tuple(getattr(self, name) for name in CHILDREN)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache=None, use_cache: bool = False,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                past_key_values=None, **kwargs) -> torch.Tensor:
        """hidden_states float32 [B, T, hidden], position_embeddings (cos, sin) [B, T, D]
        -> [B, T, hidden]."""
        cache = past_key_values if cache is None else cache  # the name before 5.24
        first_norm, attention, second_norm, mlp = self._parts
        rows = hidden_states.reshape(-1, hidden_states.shape[-1]).contiguous()  # [B * T, H]
        attended, _ = attention.attend_rows(first_norm.rows(rows), hidden_states.shape[:-1],
                                            position_embeddings, attention_mask, cache, kwargs)
        rows = rows + attended
        rows = rows + mlp.rows(second_norm.rows(rows))
        return rows.view(hidden_states.shape)


def fuse_layers(model: torch.nn.Module) -> int:
    """Swap ``model``'s Llama-style decoder layers for :class:`FusedDecoderLayer` where each
    gives the same bits (see the module's text). Returns how many were swapped."""
    classes: dict[type, type] = {}  # a layer class -> FusedDecoderLayer as its subclass
    swapped = len(swap_children(model, lambda child: _fused(child, classes)))
    logger.info("fused decoder layers: %d swapped", swapped)
    return swapped


def _fused(layer: torch.nn.Module, classes: dict[type, type]) -> FusedDecoderLayer | None:
    """A ``FusedDecoderLayer`` that computes what ``layer`` does, or None. ``classes``: the
    subclasses made so far, one per layer class."""
    children = dict(layer.named_children())
    if (type(layer).__name__ not in KNOWN_CLASSES or isinstance(layer, FusedDecoderLayer)
            or set(children) != set(CHILDREN)
            or not all(isinstance(children[name], kind) for name, kind in CHILDREN.items())):
        return None
    base = type(layer)
    if base not in classes:
        classes[base] = type(f"Fused{base.__name__}", (FusedDecoderLayer, base),
                             {"__module__": __name__, "__doc__": FusedDecoderLayer.__doc__})
    new = classes[base](layer)
    return new if _same_bits(layer, new) else None


def _same_bits(old: torch.nn.Module, new: FusedDecoderLayer) -> bool:
    """Whether ``old`` and ``new`` give the same output and cache entries on a random input:
    3 tokens after 2 cached ones, causal."""
    attention = new.self_attn
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(1, 5, attention.q_proj.in_features, generator=generator)
    angles = torch.randn(1, 5, attention.head_dim, generator=generator)
    cos, sin = angles.cos(), angles.sin()
    keyword = cache_keyword_of(old)
    results = []
    with torch.no_grad():
        for layer in (old, new):
            cache, outputs = DynamicCache(), []
            for part in (slice(0, 2), slice(2, 5)):
                outputs.append(layer(states[:, part], attention_mask=None,
                                     position_embeddings=(cos[:, part], sin[:, part]),
                                     **{keyword: cache}))
            stored = cache.layers[attention.layer_idx]
            results.append((*outputs, stored.keys, stored.values))
    return all(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
               for a, b in zip(*results))
