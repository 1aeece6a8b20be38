"""Tiny GGUF files for the tests, written with ``gguf.GGUFWriter`` in milliseconds.

A plain helper module (as ``tiny.py``): ``from tiny_gguf import write_tiny_gguf``.

``write_tiny_gguf(path, arch, qtypes)``: a 2-layer Llama (tied output, no ``output.weight``)
or Qwen2 (an output layer, q/k/v biases) with a byte-level BPE vocabulary of 264 tokens; its
matrices in the ``qtypes`` given, in turn: F32, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (quantized by
``gguf.quants.quantize``) or Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS (random blocks with
small finite scales: the gguf package cannot quantize those); any other type gguf quantizes
works too. K-quants and IQ4_XS need ``hidden`` a multiple of 256.

``assert_greedy_matches_generate(model, prompt, new_tokens, method)``: the greedy-equality
check of the quantized models (``method``'s tokens against ``model.generate``'s).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from transformers.convert_slow_tokenizer import bytes_to_unicode

Q = GGMLQuantizationType
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _tokenizer_fields(writer: GGUFWriter) -> int:
    """A byte-level BPE vocabulary (the 256 bytes, a few merges, the chat specials)."""
    alphabet = list(bytes_to_unicode().values())
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = alphabet + [m.replace(" ", "") for m in merges] + SPECIALS
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens) - 3)
    writer.add_eos_token_id(len(tokens) - 1)
    return len(tokens)


# Byte offsets of the float16 d (and dmin) in a block of the types gguf cannot quantize
SCALE_FIELDS = {Q.Q4_K: (0, 2), Q.Q6_K: (208,), Q.Q5_K: (0, 2), Q.Q3_K: (108,),
                Q.Q2_K: (80, 82), Q.IQ4_NL: (0,), Q.IQ4_XS: (0,)}


def _random_blocks(rng, rows: int, cols: int, qtype: Q) -> np.ndarray:
    """Random rows of a type gguf cannot quantize, with small, finite scales (d, and dmin
    half of it): the bytes of ``[rows, cols]``; the integer scales and quants as drawn."""
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows, cols // block, block_bytes), dtype=np.uint8)
    scale = rng.uniform(1e-3, 4e-3, size=(rows, cols // block)).astype(np.float16)
    for field, value in zip(SCALE_FIELDS[qtype], (scale, (scale / 2).astype(np.float16))):
        blocks[..., field:field + 2] = value.view(np.uint8).reshape(rows, -1, 2)
    return blocks.reshape(rows, -1)


def _matrix(writer: GGUFWriter, rng, name: str, rows: int, cols: int, qtype: Q) -> None:
    if qtype in SCALE_FIELDS:
        writer.add_tensor(name, _random_blocks(rng, rows, cols, qtype), raw_dtype=qtype)
        return
    values = rng.normal(0.0, 0.3 / np.sqrt(cols), size=(rows, cols)).astype(np.float32)
    if qtype == Q.F32:
        writer.add_tensor(name, values)
    else:
        writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)


def write_tiny_gguf(path: Path, arch: str = "llama", qtypes=(Q.Q8_0, Q.Q4_0), *,
                    hidden: int = 64, seed: int = 0) -> Path:
    """A 2-layer model: ``qtypes`` alternate over its matrices; the llama one is tied (no
    output.weight), the qwen2 one has an output layer and q/k/v biases."""
    rng = np.random.default_rng(seed)
    heads, kv_heads, ffn, layers = 4, 2, 2 * hidden, 2
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_context_length(1024)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    vocab = _tokenizer_fields(writer)
    writer.add_vocab_size(vocab)
    kinds = iter(qtypes * 100)
    _matrix(writer, rng, "token_embd.weight", vocab, hidden, next(kinds))
    if arch != "llama":
        _matrix(writer, rng, "output.weight", vocab, hidden, next(kinds))
    writer.add_tensor("output_norm.weight", rng.uniform(0.5, 1.5, hidden).astype(np.float32))
    kv = hidden // heads * kv_heads
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden),
              "attn_output": (hidden, hidden), "ffn_gate": (ffn, hidden),
              "ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn)}
    for layer in range(layers):
        for part, (rows, cols) in shapes.items():
            _matrix(writer, rng, f"blk.{layer}.{part}.weight", rows, cols, next(kinds))
            if arch != "llama" and part in ("attn_q", "attn_k", "attn_v"):
                bias = rng.normal(0.0, 0.1, rows).astype(np.float32)
                writer.add_tensor(f"blk.{layer}.{part}.bias", bias)
        for norm in ("attn_norm", "ffn_norm"):
            weight = rng.uniform(0.5, 1.5, hidden).astype(np.float32)
            writer.add_tensor(f"blk.{layer}.{norm}.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def assert_greedy_matches_generate(model, prompt, new_tokens: int, method: str, **options):
    """Assert that ``lookahead.generate(method, **options)`` writes ``model.generate``'s greedy
    tokens, ``new_tokens`` of them (the model must have no EOS), on ``prompt`` [1, L] and on
    its echo: the prompt followed by the model's own text, which repeats, so that proposals
    are accepted several at a time. Returns the echo's result (its ``stats``)."""
    import lookahead

    def generate(ids):
        return model.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                              min_new_tokens=new_tokens, attention_mask=torch.ones_like(ids),
                              pad_token_id=0)

    expected = generate(prompt)
    echo = torch.cat([expected, expected[:, prompt.shape[1]:]], dim=1)
    for ids in (prompt, echo):
        result = lookahead.generate(model, ids, max_new_tokens=new_tokens, method=method,
                                    **options)
        assert result.sequences.tolist() == generate(ids).tolist()
    return result
