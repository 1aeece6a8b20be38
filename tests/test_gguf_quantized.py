"""Loading a GGUF with its linear layers kept quantized (``lookahead.gguf_quantized``).

Tiny Llama (tied output, q/k rows interleaved as llama.cpp writes them) and Qwen2 (output
layer and q/k/v biases) models are written to GGUF here with ``gguf.GGUFWriter``, their
matrices quantized by ``gguf.quants.quantize`` (Q8_0, Q4_0, Q4_1, Q5_0) or drawn as random
K-quant blocks (Q4_K, Q6_K, which the gguf package cannot quantize). The reference is
transformers' own GGUF loader, which de-quantises every tensor into float weights: the
quantized-linear model built by ``REFERENCE_FACTORY`` (de-quantise, ``F.linear``) must give
its logits, and greedy decoding by every method must give ``model.generate``'s tokens.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from transformers import AutoModelForCausalLM, GgufConfig
from transformers.convert_slow_tokenizer import bytes_to_unicode

import lookahead
from lookahead.gguf_quantized import (
    DequantisingLinear,
    QuantEmbedding,
    load_gguf_quantized,
    load_quantized_model,
    read_gguf,
)

pytestmark = pytest.mark.usefixtures("one_thread")

Q = GGMLQuantizationType
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class ReferenceLinear(torch.nn.Module):
    """The test's own linear factory: the whole matrix de-quantised once, then ``F.linear``."""

    def __init__(self, raw: torch.Tensor, qtype: int, in_features: int, bias=None) -> None:
        super().__init__()
        values = dequantize(raw.numpy(), Q(qtype)).reshape(raw.shape[0], in_features)
        self.weight = torch.from_numpy(values.copy())
        self.bias = bias
        self.qtype = qtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return torch.nn.functional.linear(x, self.weight.to(x.dtype), bias)


REFERENCE_FACTORY = ReferenceLinear


# ----------------------------------------------------------------------------- tiny GGUF files


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


def _random_blocks(rng, rows: int, cols: int, qtype: Q) -> np.ndarray:
    """Random K-quant rows with small, finite scales: the bytes of ``[rows, cols]``."""
    block_bytes = {Q.Q4_K: 144, Q.Q6_K: 210}[qtype]
    blocks = rng.integers(0, 256, size=(rows, cols // 256, block_bytes), dtype=np.uint8)
    scale = rng.uniform(1e-3, 4e-3, size=(rows, cols // 256)).astype(np.float16)
    if qtype == Q.Q4_K:  # d, dmin: the block's first two halves
        blocks[..., 0:2] = scale.view(np.uint8).reshape(rows, -1, 2)
        blocks[..., 2:4] = (scale / 2).astype(np.float16).view(np.uint8).reshape(rows, -1, 2)
    else:  # Q6_K: d, the block's last half; its int8 scales as drawn
        blocks[..., 208:210] = scale.view(np.uint8).reshape(rows, -1, 2)
    return blocks.reshape(rows, -1)


def _matrix(writer: GGUFWriter, rng, name: str, rows: int, cols: int, qtype: Q) -> None:
    if qtype in (Q.Q4_K, Q.Q6_K):
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
    writer.add_context_length(256)
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


CASES = {
    "llama-q8_0-q4_0": ("llama", (Q.Q8_0, Q.Q4_0), 64),
    "llama-q4_1-q5_0": ("llama", (Q.Q4_1, Q.Q5_0), 64),
    "qwen2-q8_0-q4_1": ("qwen2", (Q.Q8_0, Q.Q4_1), 64),
    "qwen2-q4_k-q6_k": ("qwen2", (Q.Q4_K, Q.Q6_K), 256),
    "llama-q4_k-q6_k": ("llama", (Q.Q6_K, Q.Q4_K), 256),
}


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")
    return {case: write_tiny_gguf(folder / f"{case}.gguf", arch, qtypes, hidden=hidden)
            for case, (arch, qtypes, hidden) in CASES.items()}


def _dequantised_reference(path: Path, dtype: torch.dtype):
    """Transformers' GGUF loader: every tensor de-quantised into float weights."""
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=dtype,
        quantization_config=GgufConfig(dequantize=True))
    assert all(type(m).__name__ == "Linear" for m in model.modules() if hasattr(m, "in_features"))
    return model.eval()


PROMPT = torch.tensor([[256, 3, 70, 71, 72, 3, 70, 71, 72, 3, 70, 71, 9, 100, 101, 102]])


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("factory", [REFERENCE_FACTORY, DequantisingLinear],
                         ids=["reference", "dequantising"])
def test_logits_equal_the_dequantised_model(gguf_files, case, factory) -> None:
    path = gguf_files[case]
    model, _ = load_gguf_quantized(path, factory, torch.float64)
    reference = _dequantised_reference(path, torch.float64)
    linears = [m for m in model.modules() if isinstance(m, factory)]
    assert len(linears) == 2 * 7 + 1  # every projection and the output layer
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert isinstance(model.get_input_embeddings(), QuantEmbedding)
    with torch.inference_mode():
        ours, theirs = model(PROMPT).logits, reference(PROMPT).logits
    assert ours.shape == theirs.shape == (1, PROMPT.shape[1], model.config.vocab_size)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


def test_tied_output_shares_the_embedding_bytes(gguf_files) -> None:
    model, _ = load_gguf_quantized(gguf_files["llama-q8_0-q4_0"], DequantisingLinear)
    embedding, output = model.get_input_embeddings(), model.get_output_embeddings()
    assert output.raw.data_ptr() == embedding.raw.data_ptr()
    assert model.config.tie_word_embeddings
    # The matrices are views of the mapped file: no parameter holds a weight matrix.
    assert all(p.dim() == 1 for p in model.parameters())


def test_llama_q_rows_are_reordered_and_v_rows_are_not(gguf_files) -> None:
    path = gguf_files["llama-q8_0-q4_0"]
    model, _ = load_gguf_quantized(path, DequantisingLinear)
    stored = read_gguf(path).tensors
    attention = model.model.layers[0].self_attn
    assert not torch.equal(attention.q_proj.raw, torch.from_numpy(stored["blk.0.attn_q.weight"]
                                                                  .data))
    assert torch.equal(attention.v_proj.raw, torch.from_numpy(stored["blk.0.attn_v.weight"].data))
    assert sorted(attention.q_proj.raw.tolist()) == sorted(stored["blk.0.attn_q.weight"]
                                                           .data.tolist())


@pytest.mark.parametrize("case", ["llama-q4_1-q5_0", "qwen2-q4_k-q6_k"])
@pytest.mark.parametrize("method", ["lookahead", "prompt_lookup", "autoregressive"])
def test_greedy_methods_equal_generate(gguf_files, case, method) -> None:
    model, _ = load_gguf_quantized(gguf_files[case], REFERENCE_FACTORY, torch.float64)
    model.generation_config.eos_token_id = None
    prompt = PROMPT
    expected = model.generate(prompt, max_new_tokens=20, do_sample=False, min_new_tokens=20,
                              attention_mask=torch.ones_like(prompt), pad_token_id=0)
    # The model's own text fed back: its continuation repeats, so proposals get accepted.
    echo = torch.cat([expected, expected[:, prompt.shape[1]:]], dim=1)
    for ids in (prompt, echo):
        want = model.generate(ids, max_new_tokens=20, do_sample=False, min_new_tokens=20,
                              attention_mask=torch.ones_like(ids), pad_token_id=0)
        result = lookahead.generate(model, ids, 20, method)
        assert result.sequences.tolist() == want.tolist()


def test_meta_cache_is_written_once_and_read_after(gguf_files, tmp_path) -> None:
    path, cache = gguf_files["qwen2-q8_0-q4_1"], tmp_path / "meta"
    first, tokenizer = load_gguf_quantized(path, DequantisingLinear, meta_cache=cache)
    assert (cache / "config.json").is_file() and (cache / "tokenizer.json").is_file()
    stamp = (cache / "config.json").stat().st_mtime_ns
    started = time.perf_counter()
    second, cached_tokenizer = load_gguf_quantized(path, DequantisingLinear, meta_cache=cache)
    assert time.perf_counter() - started < 30  # a busy machine: seconds, not minutes
    assert (cache / "config.json").stat().st_mtime_ns == stamp
    assert second.config.to_dict() == first.config.to_dict()
    text = "the hat in a tree <|im_end|>"
    assert cached_tokenizer(text).input_ids == tokenizer(text).input_ids
    with torch.inference_mode():
        torch.testing.assert_close(second(PROMPT).logits, first(PROMPT).logits, rtol=0, atol=0)


def test_types_the_factory_does_not_take_become_plain_linears(gguf_files) -> None:
    path = gguf_files["llama-q8_0-q4_0"]
    model, _ = load_gguf_quantized(path, DequantisingLinear, torch.float64,
                                   supported_qtypes={int(Q.Q8_0)})
    kinds = {type(m).__name__ for m in model.modules() if hasattr(m, "in_features")}
    assert kinds == {"DequantisingLinear", "Linear"}
    assert all(m.qtype == Q.Q8_0 for m in model.modules() if isinstance(m, DequantisingLinear))
    reference = _dequantised_reference(path, torch.float64)
    with torch.inference_mode():
        torch.testing.assert_close(model(PROMPT).logits, reference(PROMPT).logits,
                                   rtol=1e-6, atol=1e-6)


def test_bad_input_names_the_argument(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="gguf_path"):
        load_gguf_quantized(tmp_path / "absent.gguf", DequantisingLinear)
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_gguf_quantized(not_gguf, DequantisingLinear)
    with pytest.raises(ValueError, match="dtype"):
        load_gguf_quantized(not_gguf, DequantisingLinear, "float32")


def test_embedding_looks_up_dequantised_rows() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(size=(10, 64)).astype(np.float32)
    raw = torch.from_numpy(quantize(values, Q.Q8_0))
    embedding = QuantEmbedding(raw, Q.Q8_0, 64, torch.float32)
    ids = torch.tensor([[3, 0, 9], [3, 3, 1]])
    table = torch.from_numpy(dequantize(raw.numpy(), Q.Q8_0))
    assert embedding(ids).shape == (2, 3, 64)
    assert torch.equal(embedding(ids), table[ids])
    with pytest.raises(ValueError, match="raw"):
        QuantEmbedding(torch.zeros(4, 8), Q.Q8_0, 64, torch.float32)


def test_load_quantized_model_takes_a_path_and_caches_its_metadata(gguf_files, tmp_path):
    path = gguf_files["qwen2-q8_0-q4_1"]
    model, _ = load_quantized_model(path, DequantisingLinear, cache_dir=tmp_path)
    assert model.name_or_path == str(path)
    assert len(list((tmp_path / "models").glob("qwen2-q8_0-q4_1-*/gguf-meta/config.json"))) == 1
    with pytest.raises(ValueError, match="name_or_path"):
        load_quantized_model(tmp_path / "model.bin", DequantisingLinear, cache_dir=tmp_path)


# ----------------------------------------------------------------------------- the real model


def _factories():
    """The reference, and the quantized kernel where it is installed."""
    found = [pytest.param(DequantisingLinear, None, id="dequantising")]
    try:
        from lookahead.kernels.quant_linear import QuantLinear, supported_qtypes
    except ImportError:
        return found
    return [*found, pytest.param(QuantLinear, supported_qtypes(), id="quant_linear")]


@pytest.mark.slow
@pytest.mark.parametrize(("factory", "supported"), _factories())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_smollm2_logits_match_the_dequantised_model(factory, supported, dtype, tmp_path):
    from lookahead.models import (
        ModelNotAvailableError,
        chat_prompt,
        find_gguf,
        get_model_spec,
    )

    try:
        path = find_gguf(get_model_spec("smollm2-135m"))
    except ModelNotAvailableError as error:
        pytest.skip(str(error))
    model, tokenizer = load_quantized_model("smollm2-135m", factory, dtype, cache_dir=tmp_path,
                                            supported_qtypes=supported)
    reference = _dequantised_reference(path, torch.float32)
    ids = chat_prompt(tokenizer, "Write a Python function that returns the n-th prime.")
    with torch.inference_mode():
        ours, theirs = model(ids).logits.float(), reference(ids).logits
    agree = (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    error = (ours - theirs).abs().max().item() / theirs.abs().max().item()
    if factory is DequantisingLinear and dtype == torch.float32:  # the same sums, in order
        assert agree == 1.0 and error < 1e-4
    assert agree >= 0.9, f"top-1 agrees on {agree:.0%} of {ids.shape[1]} positions"
    assert error < 0.1
