"""Loading a GGUF with its linear layers kept quantized (``lookahead.models.gguf_quantized``).

Tiny Llama (tied output, q/k rows interleaved as llama.cpp writes them) and Qwen2 (output
layer and q/k/v biases) models are written to GGUF here with ``gguf.GGUFWriter``, their
matrices quantized by ``gguf.quants.quantize`` (Q8_0, Q4_0, Q4_1, Q5_0) or drawn as random
K-quant blocks (Q4_K, Q6_K, which the gguf package cannot quantize). The reference is
transformers' own GGUF loader, which de-quantises every tensor into float weights: the
quantized-linear model built by ``REFERENCE_FACTORY`` (de-quantise, ``F.linear``) must give
its logits, and greedy decoding by every method must give ``model.generate``'s tokens.
"""

from __future__ import annotations

import copy

import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from tiny_gguf import assert_greedy_matches_generate, write_tiny_gguf
from transformers import AutoModelForCausalLM, GgufConfig

from lookahead.models.gguf_quantized import (
    DequantisingLinear,
    QuantEmbedding,
    load_gguf_quantized,
    load_quantized_model,
    read_gguf,
)

pytestmark = pytest.mark.usefixtures("one_thread")

Q = GGMLQuantizationType


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
    assert_greedy_matches_generate(model, PROMPT, 20, method)


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


def test_a_scaled_embedding_multiplies_its_rows_as_gemma_does() -> None:
    """Gemma's embedding scales its rows by sqrt(hidden size) in the embedding's dtype; the
    quantized one keeps that scale."""
    values = np.random.default_rng(3).normal(size=(10, 64)).astype(np.float32)
    raw = torch.from_numpy(quantize(values, Q.Q8_0))
    table = torch.from_numpy(dequantize(raw.numpy(), Q.Q8_0))
    scale = torch.tensor(64 ** 0.5)
    embedding = QuantEmbedding(raw, Q.Q8_0, 64, torch.float32, scale=scale)
    ids = torch.tensor([[1, 4]])
    assert torch.equal(embedding(ids), table[ids] * scale)


@pytest.mark.parametrize("cached_rows", [0, 2, 100])
def test_embedding_keeps_its_last_rows_and_looks_up_the_same(cached_rows) -> None:
    values = np.random.default_rng(2).normal(size=(10, 64)).astype(np.float32)
    raw = torch.from_numpy(quantize(values, Q.Q8_0))
    table = torch.from_numpy(dequantize(raw.numpy(), Q.Q8_0))
    embedding = QuantEmbedding(raw, Q.Q8_0, 64, torch.float32, cached_rows=cached_rows)
    for ids in ([[3, 0, 9]], [[3, 3, 1]], [[7]], [[9, 3]], [[0, 0, 0, 5]]):
        ids = torch.tensor(ids)
        assert torch.equal(embedding(ids), table[ids])
        assert len(embedding._rows) <= cached_rows
    if cached_rows == 2:
        assert list(embedding._rows) == [0, 5]  # the last two looked up, oldest first
    copied = copy.deepcopy(embedding)  # a lock is not copied, a new one is made
    ids = torch.tensor([[4, 0]])
    assert torch.equal(copied(ids), table[ids])
    with pytest.raises(ValueError, match="cached_rows"):
        QuantEmbedding(raw, Q.Q8_0, 64, torch.float32, cached_rows=-1)


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


class Smollm2Reference(NamedTuple):
    cache_dir: Path  # holds the model's config and tokenizer, read from its GGUF
    ids: torch.Tensor  # a chat prompt [1, L]
    logits: torch.Tensor  # transformers' de-quantised model's, float32 [1, L, V]


@pytest.fixture(scope="module")
def smollm2_reference(tmp_path_factory) -> Smollm2Reference:
    """The bundled SmolLM2 read once for every kernel and dtype: de-quantising it takes some
    15 s, reading its GGUF's config and tokenizer 7 s (cached here for the tests' loads)."""
    from lookahead.models.gguf import find_gguf
    from lookahead.models.load import chat_prompt
    from lookahead.models.registry import ModelNotAvailableError, get_model_spec

    try:
        path = find_gguf(get_model_spec("smollm2-135m"))
    except ModelNotAvailableError as error:
        pytest.skip(str(error))
    cache_dir = tmp_path_factory.mktemp("smollm2")
    _, tokenizer = load_quantized_model("smollm2-135m", DequantisingLinear, torch.float32,
                                        cache_dir=cache_dir)
    ids = chat_prompt(tokenizer, "Write a Python function that returns the n-th prime.")
    reference = _dequantised_reference(path, torch.float32)
    with torch.inference_mode():
        logits = reference(ids).logits
    return Smollm2Reference(cache_dir, ids, logits)


@pytest.mark.slow
@pytest.mark.parametrize(("factory", "supported"), _factories())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_smollm2_logits_match_the_dequantised_model(factory, supported, dtype,
                                                    smollm2_reference):
    model, _ = load_quantized_model("smollm2-135m", factory, dtype,
                                    cache_dir=smollm2_reference.cache_dir,
                                    supported_qtypes=supported)
    ids, theirs = smollm2_reference.ids, smollm2_reference.logits
    with torch.inference_mode():
        ours = model(ids).logits.float()
    agree = (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    error = (ours - theirs).abs().max().item() / theirs.abs().max().item()
    if factory is DequantisingLinear and dtype == torch.float32:  # the same sums, in order
        assert agree == 1.0 and error < 1e-4
    assert agree >= 0.9, f"top-1 agrees on {agree:.0%} of {ids.shape[1]} positions"
    assert error < 0.1
