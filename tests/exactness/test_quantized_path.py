"""The quantized path as users reach it: ``load_model`` of a GGUF keeps the linears as GGUF
blocks on the integer kernel, and every method's greedy text equals the same quantized
model's own ``model.generate``; the packed records are cached and read back."""

from __future__ import annotations

import logging

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tiny_gguf import assert_greedy_matches_generate, write_tiny_gguf

import lookahead
from lookahead.kernels import Kernel
from lookahead.kernels.packing import apply_packing, packing_of
from lookahead.kernels.quant_linear import QuantLinear
from lookahead.kernels.row_ops import GatedMLP, RowRMSNorm

pytestmark = pytest.mark.usefixtures("one_thread")

CASES = {"llama-q4_1-q8_0": ("llama", (Q.Q4_1, Q.Q8_0), 64),
         "qwen2-q4_k-q6_k": ("qwen2", (Q.Q4_K, Q.Q6_K), 256),
         "llama-q4_0-q4_k": ("llama", (Q.Q4_0, Q.Q4_K), 256),
         "qwen2-q5_0-q8_0": ("qwen2", (Q.Q5_0, Q.Q8_0), 64),
         "qwen2-q5_k-iq4_xs-q6_k": ("qwen2", (Q.Q5_K, Q.IQ4_XS, Q.Q6_K), 256),
         "llama-q5_1-iq4_nl": ("llama", (Q.Q5_1, Q.IQ4_NL), 64),
         "qwen2-q3_k-q2_k": ("qwen2", (Q.Q3_K, Q.Q2_K), 256)}
PROMPT = torch.tensor([[256, 3, 70, 71, 72, 3, 70, 71, 72, 3, 70, 71, 9, 100, 101, 102]])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quantized")
    return {case: write_tiny_gguf(folder / f"{case}.gguf", arch, qtypes, hidden=hidden)
            for case, (arch, qtypes, hidden) in CASES.items()}


def _load(path, cache):
    model, tokenizer = lookahead.load_model(path, cache_dir=cache)
    model.generation_config.eos_token_id = None
    return model, tokenizer


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("method", ["autoregressive", "lookahead", "prompt_lookup", "draft"])
def test_every_method_writes_what_the_quantized_model_writes(files, tmp_path, case, method):
    model, _ = _load(files[case], tmp_path)
    linears = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(linears) == 2 * 7 + 1 and model.dtype == torch.float32
    # the norms and MLPs run on the row operations (lookahead.kernels.row_ops)
    assert sum(isinstance(m, GatedMLP) for m in model.modules()) == 2
    assert sum(isinstance(m, RowRMSNorm) for m in model.modules()) == 2 * 2 + 1
    options = {"draft_model": model} if method == "draft" else {}
    result = assert_greedy_matches_generate(model, PROMPT, 24, method, **options)
    if method == "draft":  # the model drafting for itself is always right: whole drafts kept
        assert result.stats.tokens_per_step > 2.0


@pytest.mark.parametrize("case", ["llama-q4_1-q8_0", "qwen2-q4_k-q6_k"])
def test_a_draft_over_the_first_ids_changes_no_token(files, tmp_path, case):
    """The draft's output layer cut to the first 64 of 264 ids (on the quantized kernel, records
    shared) proposes other tokens, never other text."""
    model, _ = _load(files[case], tmp_path)
    assert_greedy_matches_generate(model, PROMPT, 24, "draft", draft_model=model, draft_vocab=64)


def test_the_packed_records_are_cached_and_read_back(files, tmp_path, caplog):
    path = files["qwen2-q4_k-q6_k"]
    first, _ = _load(path, tmp_path)
    cached = list(tmp_path.glob("models/*/quantized/records.safetensors"))
    assert len(cached) == 1
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        second, _ = _load(path, tmp_path)
    assert not caplog.records
    # packed or read back, every layer's records sit in one (huge-page) arena
    for model in (first, second):
        storages = {m.records.untyped_storage().data_ptr() for m in model.modules()
                    if isinstance(m, QuantLinear)}
        assert len(storages) == 1
    with torch.inference_mode():
        assert torch.equal(first(PROMPT).logits, second(PROMPT).logits)
    # A damaged cache is packed again, with a warning, and gives the same logits.
    cached[0].write_bytes(cached[0].read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        third, _ = _load(path, tmp_path)
    assert any("packing again" in record.getMessage() for record in caplog.records)
    with torch.inference_mode():
        assert torch.equal(first(PROMPT).logits, third(PROMPT).logits)


def test_an_explicit_dtype_or_dequantize_keeps_float_weights(files, tmp_path):
    path = files["llama-q4_1-q8_0"]
    for kwargs in ({"dtype": "float32"}, {"quantized": False}):
        model, _ = lookahead.load_model(path, cache_dir=tmp_path, **kwargs)
        assert not any(isinstance(m, QuantLinear) for m in model.modules())
        assert any(type(m) is torch.nn.Linear for m in model.modules())


def test_quantized_true_on_a_model_without_gguf_names_the_argument(tmp_path):
    from tiny import save_tiny_chat_model

    folder = save_tiny_chat_model(tmp_path / "tiny")
    with pytest.raises(ValueError, match="quantized=True: the model is not a GGUF"):
        lookahead.load_model(folder, quantized=True)


def test_a_pass_of_k_tokens_gives_the_bits_of_k_passes_of_one(files, tmp_path):
    """Row invariance of the whole quantized model (integer linears, row-invariant
    attention): the logits of a 6-token pass equal, bit for bit, those of 6 passes of one
    token over the same cache. Without it a method's greedy text may part from autoregressive
    decoding's at a near-tie on a real model. The cache is 600 tokens long: there PyTorch's
    SDPA splits the keys into blocks, and its 6-token pass differed from the one-token passes
    by 3e-5 (torch 2.13, AMD EPYC, AVX-512)."""
    from lookahead.cache import cache_keyword, new_cache

    model, _ = _load(files["qwen2-q4_k-q6_k"], tmp_path)
    assert model.config._attn_implementation == "lookahead_invariant"
    tokens = torch.randint(0, 250, (1, 600), generator=torch.Generator().manual_seed(0))
    prompt, step = tokens[:, :-6], tokens[:, -6:]
    keyword = cache_keyword(model)
    with torch.inference_mode():
        cache = {keyword: new_cache()}
        model(prompt, **cache)
        together = model(step, **cache).logits[0]
        cache = {keyword: new_cache()}
        model(prompt, **cache)
        alone = torch.cat([model(step[:, i:i + 1], **cache).logits[0]
                           for i in range(step.shape[1])])
    assert torch.equal(together, alone)


@pytest.mark.parametrize("method", ["autoregressive", "lookahead"])
def test_a_row_of_a_batch_writes_what_it_writes_alone(files, tmp_path, method, monkeypatch):
    """Three prompts of different lengths, left-padded, decoded together in one forward pass
    per step over a batched cache (by default: the rows are independent on this path): each
    row's tokens are those of its own call."""
    import lookahead.batch
    from lookahead.kernels.invariant_attention import rows_are_independent

    model, _ = _load(files["llama-q4_1-q8_0"], tmp_path)
    assert rows_are_independent(model)
    together_calls = []
    decode_together = lookahead.batch.decode_together
    monkeypatch.setattr(lookahead.batch, "decode_together",
                        lambda *a, **k: together_calls.append(1) or decode_together(*a, **k))
    rows = [PROMPT[0].tolist(), PROMPT[0, 4:].tolist(), PROMPT[0, 9:].tolist()]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    together = lookahead.generate(model, ids, attention_mask=mask, max_new_tokens=20,
                                  method=method, pad_token_id=0)
    assert together_calls == [1]
    for row, prompt in enumerate(rows):
        alone = lookahead.generate(model, torch.tensor([prompt]), max_new_tokens=20,
                                   method=method)
        assert together.sequences[row, width:].tolist() == alone.sequences[0, len(prompt):].tolist()


def test_the_kernel_names_the_quantized_path_and_packing_refuses_it(files, tmp_path):
    path = files["llama-q4_1-q8_0"]
    model, _ = lookahead.load_model(path, cache_dir=tmp_path, packed_weights=False)
    assert packing_of(model) is Kernel.QUANTIZED  # False (plain) packs nothing: still quantized
    assert apply_packing(model, None) is Kernel.QUANTIZED
    assert apply_packing(model, Kernel.QUANTIZED) is Kernel.QUANTIZED
    with pytest.raises(ValueError, match="packed_weights: .*quantized .*quantized=False"):
        apply_packing(model, Kernel.PACKED)
    # Asked for by the kernel: quantized whatever the compute dtype.
    model, _ = lookahead.load_model(path, "float32", cache_dir=tmp_path,
                                    packed_weights=Kernel.QUANTIZED)
    assert packing_of(model) is Kernel.QUANTIZED
    with pytest.raises(ValueError, match="packed_weights='quantized' .*quantized=False"):
        lookahead.load_model(path, cache_dir=tmp_path, packed_weights="quantized",
                             quantized=False)
    plain, _ = lookahead.load_model(path, "float32", cache_dir=tmp_path)
    assert packing_of(plain) is Kernel.PLAIN
    with pytest.raises(ValueError, match="packed_weights: 'quantized' is chosen when the model "
                                         "loads"):
        apply_packing(plain, "quantized")
    with pytest.raises(ValueError, match="packed_weights must be None .*got 'fast'"):
        lookahead.load_model(path, cache_dir=tmp_path, packed_weights="fast")
