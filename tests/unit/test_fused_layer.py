"""lookahead.kernels.fused_layer: a swapped decoder layer gives the layer's bits and cache,
stays where transformers records hidden states, and only layers that compute the same are
swapped."""

from __future__ import annotations

import copy

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from test_fused_attention import DIM, HEADS, HIDDEN, KV_HEADS, angles, attention_block
from test_quant_linear import layer
from tiny_gguf import write_tiny_gguf
from transformers import DynamicCache, LlamaConfig, Qwen2Config
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2

import lookahead
from lookahead.kernels.fused_attention import FusedAttention, fuse_attention
from lookahead.kernels.fused_layer import FusedDecoderLayer, fuse_layers
from lookahead.kernels.row_ops import GatedMLP, RowRMSNorm, fuse_row_ops

INTERMEDIATE = 512
LAYERS = {"llama": (LlamaConfig, modeling_llama.LlamaDecoderLayer),
          "qwen2": (Qwen2Config, modeling_qwen2.Qwen2DecoderLayer)}


def decoder_layer(kind: str, layer_class=None, seed: int = 0) -> torch.nn.Module:
    """transformers' Llama or Qwen2 decoder layer (index 1) on quantized linears, with
    random norm weights, eager attention."""
    config_class, default_class = LAYERS[kind]
    config = config_class(hidden_size=HIDDEN, num_attention_heads=HEADS,
                          num_key_value_heads=KV_HEADS, intermediate_size=INTERMEDIATE,
                          num_hidden_layers=2)
    config._attn_implementation = "eager"
    block = (layer_class or default_class)(config, layer_idx=1).eval()
    block.self_attn = attention_block(kind, seed=seed)
    for name, out, width, qtype in (("gate_proj", INTERMEDIATE, HIDDEN, Q.Q4_K),
                                    ("up_proj", INTERMEDIATE, HIDDEN, Q.Q4_K),
                                    ("down_proj", HIDDEN, INTERMEDIATE, Q.Q6_K)):
        setattr(block.mlp, name, layer(qtype, out, width, seed=seed + out + width))
    generator = torch.Generator().manual_seed(seed)
    for norm in (block.input_layernorm, block.post_attention_layernorm):
        norm.weight.data = 1 + 0.3 * torch.randn(HIDDEN, generator=generator)
    return block


def fused_children(block: torch.nn.Module) -> torch.nn.Module:
    """``block`` in a container, its norms, MLP and attention swapped (not the layer)."""
    model = torch.nn.ModuleDict({"layer": block})
    fuse_row_ops(model)
    fuse_attention(model, modeling_llama.eager_attention_forward)
    assert isinstance(model["layer"].self_attn, FusedAttention)
    assert isinstance(model["layer"].mlp, GatedMLP)
    assert isinstance(model["layer"].input_layernorm, RowRMSNorm)
    return model


def run(block, steps: list[int], seed: int = 5):
    """Outputs of ``steps`` calls (that many tokens each, batch 2) through one cache, and
    the cache's layer."""
    generator = torch.Generator().manual_seed(seed)
    cache, outputs, past = DynamicCache(), [], 0
    with torch.no_grad():
        for tokens in steps:
            states = torch.randn(2, tokens, HIDDEN, generator=generator) * 2
            outputs.append(block(states, attention_mask=None,
                                 position_embeddings=angles(2, tokens, seed=past),
                                 cache=cache))
            past += tokens
    return outputs, cache.layers[1]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_swapped_layer_gives_the_same_bits_and_cache(kind):
    model = fused_children(decoder_layer(kind))
    before, before_cache = run(model["layer"], [4, 1, 3])
    assert fuse_layers(model) == 1
    swapped = model["layer"]
    assert isinstance(swapped, FusedDecoderLayer)
    # still the layer's class, where transformers hooks the hidden states of every layer
    assert isinstance(swapped, LAYERS[kind][1])
    after, after_cache = run(swapped, [4, 1, 3])
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert torch.equal(before_cache.keys, after_cache.keys)
    assert torch.equal(before_cache.values, after_cache.values)
    assert fuse_layers(model) == 0  # swapped once


def test_a_copy_calls_its_own_tensors():
    model = fused_children(decoder_layer("qwen2"))
    fuse_layers(model)
    twin = copy.deepcopy(model)
    expected, _ = run(model["layer"], [3])
    twin["layer"].input_layernorm.weight.data.mul_(2)
    twin["layer"].mlp.down_proj.records.zero_()
    changed, _ = run(twin["layer"], [3])
    again, _ = run(model["layer"], [3])
    assert torch.equal(again[0], expected[0])
    assert not torch.equal(changed[0], expected[0])


def test_moving_the_model_keeps_the_calls_on_its_tensors():
    model = fused_children(decoder_layer("llama"))
    fuse_layers(model)
    expected, _ = run(model["layer"], [2, 2])
    model.to(torch.float32)  # _apply: every module's calls are taken again
    norm = model["layer"].post_attention_layernorm
    assert norm._call[1] is norm.weight
    attention = model["layer"].self_attn
    assert attention._calls[0][1][0] is attention.q_proj.records
    again, _ = run(model["layer"], [2, 2])
    assert all(torch.equal(a, b) for a, b in zip(expected, again))


class ShiftedQwen2DecoderLayer(modeling_qwen2.Qwen2DecoderLayer):
    """Looks like Qwen2's layer and computes something else."""

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs) + 1.0


ShiftedQwen2DecoderLayer.__name__ = "Qwen2DecoderLayer"


def test_only_layers_that_compute_the_same_are_swapped():
    plain = fused_children(decoder_layer("qwen2"))["layer"]
    shifted = fused_children(decoder_layer("qwen2", ShiftedQwen2DecoderLayer))["layer"]
    unfused_mlp = decoder_layer("llama")  # children as transformers made them
    extra = fused_children(decoder_layer("llama"))["layer"]
    extra.dropout = torch.nn.Dropout(0.0)  # a child the fused forward would skip
    model = torch.nn.ModuleDict({"plain": plain, "shifted": shifted,
                                 "unfused": unfused_mlp, "extra": extra})
    assert fuse_layers(model) == 1
    assert isinstance(model["plain"], FusedDecoderLayer)
    assert [type(model[name]) for name in ("shifted", "unfused", "extra")] == [
        ShiftedQwen2DecoderLayer, modeling_llama.LlamaDecoderLayer,
        modeling_llama.LlamaDecoderLayer]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_loaded_model_records_every_layers_hidden_states(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    write_tiny_gguf(path, arch, (Q.Q8_0, Q.Q4_0))
    model, _ = lookahead.load_model(str(path), cache_dir=tmp_path)
    layers = model.model.layers
    assert all(isinstance(block, FusedDecoderLayer) for block in layers)
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    assert len(out.hidden_states) == len(layers) + 1
    # the embeddings, then what each layer wrote (the last one normed, transformers' way)
    assert torch.equal(out.hidden_states[0], model.model.embed_tokens(ids))
    assert not torch.equal(out.hidden_states[1], out.hidden_states[0])
    assert torch.equal(model.lm_head(out.hidden_states[-1]), out.logits)
    assert DIM * HEADS == HIDDEN  # the blocks above share test_fused_attention's shapes
