"""lookahead.kernels.fused_attention: the rotary call gives transformers' bits, and
fuse_attention swaps only attention blocks that give the same output and cache, bit for bit."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from test_quant_linear import layer
from transformers import DynamicCache, LlamaConfig, Qwen2Config
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2

from lookahead.kernels.fused_attention import FusedAttention, fuse_attention
from lookahead.kernels.row_ops import load_row_ops

HIDDEN, HEADS, KV_HEADS = 256, 4, 2
DIM = HIDDEN // HEADS


def angles(batch: int, tokens: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    theta = torch.randn(batch, tokens, DIM, generator=torch.Generator().manual_seed(seed)) * 3
    return theta.cos(), theta.sin()


@pytest.mark.parametrize("cos_batch", [1, 2])
def test_the_rotary_call_gives_transformers_bits(cos_batch):
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(2, 5, HEADS, DIM, generator=generator) * 4  # [B, T, H, D]
    key = torch.randn(2, 5, KV_HEADS, DIM, generator=generator)
    cos, sin = angles(cos_batch, 5)
    ours = load_row_ops().rotary(query, key, cos, sin)
    theirs = modeling_qwen2.apply_rotary_pos_emb(query.transpose(1, 2), key.transpose(1, 2),
                                                  cos, sin)
    for mine, reference in zip(ours, theirs):
        assert torch.equal(mine.transpose(1, 2), reference)


def test_the_rotary_call_names_what_it_takes():
    rotary = load_row_ops().rotary
    query, key = torch.randn(1, 3, HEADS, DIM), torch.randn(1, 3, KV_HEADS, DIM)
    cos, sin = angles(1, 3)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        rotary(query.double(), key, cos, sin)
    with pytest.raises(RuntimeError, match=r"cos and sin must be \[B or 1, T, D\]"):
        rotary(query, key, cos[:, :2].contiguous(), sin[:, :2].contiguous())
    with pytest.raises(RuntimeError, match=r"query and key must be \[B, T, H, D\]"):
        rotary(query, key[:, :2].contiguous(), cos, sin)


def attention_block(kind: str, seed: int = 0, **config_options) -> torch.nn.Module:
    """transformers' Llama or Qwen2 attention on quantized projections, eager attention."""
    config_class, module = {"llama": (LlamaConfig, modeling_llama.LlamaAttention),
                            "qwen2": (Qwen2Config, modeling_qwen2.Qwen2Attention)}[kind]
    config = config_class(hidden_size=HIDDEN, num_attention_heads=HEADS,
                          num_key_value_heads=KV_HEADS, num_hidden_layers=2, **config_options)
    config._attn_implementation = "eager"
    block = module(config, layer_idx=1).eval()
    kv = KV_HEADS * DIM
    for name, out, bias in (("q_proj", HIDDEN, True), ("k_proj", kv, True),
                            ("v_proj", kv, True), ("o_proj", HIDDEN, False)):
        weights = layer(Q.Q4_K if name != "v_proj" else Q.Q6_K, out, HIDDEN, seed=seed)
        if bias and kind == "qwen2":
            weights.bias = torch.nn.Parameter(torch.randn(out) * 0.1, requires_grad=False)
        setattr(block, name, weights)
    return block


def run(block, steps: list[int], seed: int = 3):
    """Outputs of ``steps`` calls (that many tokens each) through one cache, and the cache."""
    generator = torch.Generator().manual_seed(seed)
    cache, outputs, past = DynamicCache(), [], 0
    with torch.no_grad():
        for tokens in steps:
            states = torch.randn(1, tokens, HIDDEN, generator=generator)
            cos, sin = angles(1, tokens, seed=past)
            outputs.append(block(states, (cos, sin), None, cache=cache)[0])
            past += tokens
    return outputs, cache.layers[1]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_swapped_block_gives_the_same_bits_and_cache(kind):
    model = torch.nn.ModuleDict({"attn": attention_block(kind)})
    before, before_cache = run(model["attn"], [4, 1, 3])
    assert fuse_attention(model, modeling_llama.eager_attention_forward) == 1
    assert isinstance(model["attn"], FusedAttention)
    after, after_cache = run(model["attn"], [4, 1, 3])
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert torch.equal(before_cache.keys, after_cache.keys)
    assert torch.equal(before_cache.values, after_cache.values)


class ScaledQwen2Attention(modeling_qwen2.Qwen2Attention):
    """Looks like Qwen2's block and computes something else."""

    def forward(self, *args, **kwargs):
        out, weights = super().forward(*args, **kwargs)
        return out * 1.5, weights


ScaledQwen2Attention.__name__ = "Qwen2Attention"


def test_only_blocks_that_compute_the_same_are_swapped():
    plain = attention_block("qwen2")
    sliding = attention_block("qwen2", use_sliding_window=True, sliding_window=2,
                              max_window_layers=0)
    normed = attention_block("llama")
    normed.q_norm = torch.nn.Identity()  # a child of its own, as Qwen3's blocks have
    float_proj = attention_block("llama")
    float_proj.o_proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
    scaled = ScaledQwen2Attention(plain.config, layer_idx=1)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        setattr(scaled, name, getattr(plain, name))
    model = torch.nn.ModuleDict({"plain": plain, "sliding": sliding, "normed": normed,
                                 "float_proj": float_proj, "scaled": scaled})
    assert sliding.sliding_window == 2
    assert fuse_attention(model, modeling_qwen2.eager_attention_forward) == 1
    assert isinstance(model["plain"], FusedAttention)
    assert [type(model[name]) for name in ("sliding", "normed", "float_proj", "scaled")] == [
        modeling_qwen2.Qwen2Attention, modeling_llama.LlamaAttention,
        modeling_llama.LlamaAttention, ScaledQwen2Attention]


def test_a_swapped_block_passes_on_the_attention_functions_weights():
    model = torch.nn.ModuleDict({"attn": attention_block("llama")})
    states = torch.randn(1, 3, HIDDEN, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, before = model["attn"](states, angles(1, 3), None, cache=DynamicCache())
        fuse_attention(model, modeling_llama.eager_attention_forward)
        _, after = model["attn"](states, angles(1, 3), None, cache=DynamicCache())
    assert isinstance(model["attn"], FusedAttention)
    assert before.shape == (1, HEADS, 3, 3)  # eager attention gives its softmax weights
    assert torch.equal(after, before)
