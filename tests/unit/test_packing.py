"""Packed weights (``lookahead.kernels.packing``): the same logits and outputs, bit for bit, in bfloat16;
in float32 (swapped only when asked for) one-row logits bit for bit, several rows' within a
few 1e-6, and the same outputs.

The models are tiny random-weight ones, a little wider than conftest's (oneDNN blocks its
products; 32 wide would fit in one block), converted to bfloat16: a packed copy must give
exactly the plain copy's logits, whatever the number of tokens in the pass, and so decode the
same text with every method.
"""

from __future__ import annotations

import gc
import os

import pytest
import torch
import transformers
from hub_cache import use_hub_cache
from hypothesis import given, settings
from hypothesis import strategies as st

import lookahead
from lookahead.bench.report import summarise
from lookahead.bench.runner import BenchConfig
from lookahead.cache import cache_keyword, new_cache
from lookahead.kernels import Kernel, packing
from lookahead.kernels.packing import (BLOCK_ROWS, PackedLinear, WeightFirstLinear, apply_packing,
                               is_packed, pack_weights, packing_problem)

# Packing needs oneDNN, and a CPU whose bfloat16 reorder it supports (AVX512 or AVX-NE-CONVERT).
CPU_PROBLEM = packing.cpu_packing_problem()
needs_packing = pytest.mark.skipif(CPU_PROBLEM is not None, reason=str(CPU_PROBLEM))

WIDE = dict(vocab_size=256, hidden_size=128, intermediate_size=384, num_attention_heads=4,
            num_key_value_heads=2)


def bf16_pair(build, family: str, dtype: torch.dtype = torch.bfloat16, **overrides):
    """(plain, packed): two copies in ``dtype`` of one tiny model of ``family`` (``build``: the
    ``fresh_lm`` fixture); Gemma 2 on eager attention, which is all it has."""
    attn = "eager" if family == "gemma2" else "sdpa"
    plain = build(family, 3, attn, **WIDE, **overrides).to(dtype)
    packed = build(family, 3, attn, **WIDE, **overrides).to(dtype)
    pack_weights(packed)
    return plain, packed


def logits_in_steps(model, ids: torch.Tensor, steps: list[int]) -> list[torch.Tensor]:
    """Logits [B, T, V] of a prefill of ``ids[:, :16]`` and then of passes of ``steps`` tokens
    over the growing cache."""
    cache, start, out = {cache_keyword(model): new_cache()}, 16, []
    with torch.inference_mode():
        out.append(model(input_ids=ids[:, :start], **cache, use_cache=True).logits)
        for size in steps:
            out.append(model(input_ids=ids[:, start : start + size], **cache, use_cache=True).logits)
            start += size
    return out


@needs_packing
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "phi3", "gemma2"])
@pytest.mark.parametrize("batch", [1, 2])
def test_packed_logits_are_the_plain_logits_bit_for_bit(fresh_lm, family, batch) -> None:
    plain, packed = bf16_pair(fresh_lm, family)
    ids = torch.randint(0, 256, (batch, 16 + 1 + 5 + 16),
                        generator=torch.Generator().manual_seed(1))
    for ours, theirs in zip(logits_in_steps(packed, ids, [1, 5, 16]),
                            logits_in_steps(plain, ids, [1, 5, 16]), strict=True):
        assert torch.equal(ours, theirs)


@needs_packing
@pytest.mark.parametrize("method, options", [
    ("autoregressive", {}),
    ("lookahead", dict(window=3, ngram=3, guess=2, token_cost=0.0)),
    ("prompt_lookup", dict(num_draft_tokens=4)),
])
def test_decoding_on_packed_weights_writes_what_plain_weights_write(fresh_lm, method, options
                                                                   ) -> None:
    plain, packed = bf16_pair(fresh_lm, "llama", tie_word_embeddings=True)
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    prompt = torch.cat([prompt, prompt], dim=1)  # something for the copy to find
    reference = plain.generate(prompt, max_new_tokens=40, do_sample=False)
    assert torch.equal(packed.generate(prompt, max_new_tokens=40, do_sample=False), reference)
    ours = lookahead.generate(packed, prompt, 40, method, **options).sequences
    theirs = lookahead.generate(plain, prompt, 40, method, **options).sequences
    assert torch.equal(ours, theirs)


@needs_packing
def test_hf_prompt_lookup_and_assisted_generation_run_on_packed_weights(fresh_lm) -> None:
    plain, packed = bf16_pair(fresh_lm, "llama")
    draft = fresh_lm("llama", seed=4, **WIDE).to(torch.bfloat16)
    pack_weights(draft)
    prompt = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(5))
    prompt = torch.cat([prompt, prompt], dim=1)
    reference = plain.generate(prompt, max_new_tokens=24, do_sample=False)
    for extra in (dict(prompt_lookup_num_tokens=4), dict(assistant_model=draft)):
        output = packed.generate(prompt, max_new_tokens=24, do_sample=False, **extra)
        assert output.shape == reference.shape and output[0, :20].equal(prompt[0])


@needs_packing
def test_pack_weights_swaps_every_linear_once_and_keeps_the_tied_embedding(fresh_lm) -> None:
    model = fresh_lm("llama", **WIDE, tie_word_embeddings=True).to(torch.bfloat16)
    embedding = model.get_input_embeddings().weight.clone()
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert not is_packed(model)
    assert pack_weights(model) == linears == 2 * 7 + 1  # q k v o gate up down per layer, head
    assert is_packed(model)
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert isinstance(model.lm_head, PackedLinear)
    assert torch.equal(model.get_input_embeddings().weight, embedding)
    assert pack_weights(model) == 0  # already packed
    assert "packed for oneDNN" in repr(model.lm_head)


@needs_packing
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc")
def test_packing_lets_go_of_the_model_files_memory_map(fresh_lm, tmp_path) -> None:
    """Loaded from safetensors, the weights are views of the file's memory map; once packed,
    nothing may keep the map (the whole file) resident beside the packed copy."""
    fresh_lm("llama", **WIDE).to(torch.bfloat16).save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    prompt = torch.arange(3, 19)[None]
    before = lookahead.generate(model, prompt, max_new_tokens=8).sequences

    def mapped() -> bool:
        gc.collect()
        with open("/proc/self/maps") as maps:
            return str(tmp_path) in maps.read()

    assert mapped()  # else this test would not test anything
    pack_weights(model)
    assert not mapped()
    assert torch.equal(lookahead.generate(model, prompt, max_new_tokens=8).sequences, before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_only_bfloat16_and_float32_weights_are_packed(fresh_lm, dtype) -> None:
    model = fresh_lm("llama").to(dtype)
    problem = packing_problem(model)
    assert problem is not None and "bfloat16 or float32" in problem
    with pytest.raises(ValueError, match="model: .*bfloat16 or float32"):
        pack_weights(model)
    with pytest.raises(ValueError, match="packed_weights: .*bfloat16 or float32"):
        apply_packing(model, Kernel.PACKED)
    assert apply_packing(model, None) is Kernel.PLAIN  # the default: where it can be done
    assert apply_packing(model, Kernel.PLAIN) is Kernel.PLAIN
    assert not is_packed(model)
    with pytest.raises(ValueError, match="packed_weights applies to dtype bfloat16 or float32"):
        BenchConfig(dtype=str(dtype).removeprefix("torch."), packed_weights=Kernel.PACKED)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_packed_float32_logits_differ_from_plain_only_in_the_last_bits(fresh_lm, family) -> None:
    """Several rows taken weight first sum in another order, so not bit for bit: close, at
    every pass size."""
    plain, packed = bf16_pair(fresh_lm, family, torch.float32)
    ids = torch.randint(0, 256, (2, 16 + 1 + 5 + 16), generator=torch.Generator().manual_seed(1))
    for ours, theirs in zip(logits_in_steps(packed, ids, [1, 5, 16]),
                            logits_in_steps(plain, ids, [1, 5, 16]), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method, options", [
    ("lookahead", dict(window=3, ngram=3, guess=2, token_cost=0.0)),
    ("prompt_lookup", dict(num_draft_tokens=4)),
])
def test_decoding_on_packed_float32_weights_writes_what_generate_writes(fresh_lm, method,
                                                                       options) -> None:
    plain, packed = bf16_pair(fresh_lm, "llama", torch.float32, tie_word_embeddings=True)
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    prompt = torch.cat([prompt, prompt], dim=1)  # something for the copy to find
    reference = plain.generate(prompt, max_new_tokens=40, do_sample=False)
    assert torch.equal(packed.generate(prompt, max_new_tokens=40, do_sample=False), reference)
    ours = lookahead.generate(packed, prompt, 40, method, **options)
    assert torch.equal(ours.sequences, reference)
    assert ours.stats.steps < 40  # several tokens were accepted in some pass


@settings(max_examples=30, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=2), rows=st.integers(1, 9),
       out=st.sampled_from([8, BLOCK_ROWS, 80, 3 * BLOCK_ROWS]), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_weight_first_linear_is_f_linear_to_the_last_bits(lead, rows, out, bias, seed) -> None:
    """Any leading shape, any number of output rows (whole blocks or not): the same values to
    the last bits, contiguous, same shape."""
    torch.manual_seed(seed)
    linear = torch.nn.Linear(48, out, bias=bias)
    x = torch.randn(*lead, rows, 48)
    ours, theirs = WeightFirstLinear(linear)(x), linear(x)
    assert ours.shape == theirs.shape and ours.is_contiguous()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("out, blocked, products", [
    (2 * BLOCK_ROWS + 22, 2 * BLOCK_ROWS, 1),  # whole blocks batched, the 22 rows left plain
    (BLOCK_ROWS - 1, 0, 0),                    # not one whole block: all plain
])
def test_one_row_takes_the_weight_in_blocks_in_one_batched_product(monkeypatch, out, blocked,
                                                                   products) -> None:
    """The one-row path is the fast one: one bmm over W's whole blocks (not F.linear's
    matrix-vector product), and F.linear for the rows left over."""
    layer = WeightFirstLinear(torch.nn.Linear(48, out))
    calls = []
    real_bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda *a: calls.append(a[0].shape) or real_bmm(*a))
    x = torch.randn(1, 48)
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias),
                               rtol=1e-5, atol=1e-5)
    assert layer.blocked_rows == blocked and len(calls) == products
    assert all(shape == (blocked // BLOCK_ROWS, BLOCK_ROWS, 48) for shape in calls)
    layer(torch.randn(3, 48))  # several rows: one weight-first product, no blocks
    assert len(calls) == products


def test_a_strided_weight_is_taken_whole() -> None:
    """Blocks are views of W's rows; a weight that is a transposed view has none to give."""
    linear = torch.nn.Linear(48, 2 * BLOCK_ROWS, bias=False)
    linear.weight = torch.nn.Parameter(torch.randn(48, 2 * BLOCK_ROWS).t())
    layer = WeightFirstLinear(linear)
    x = torch.randn(1, 48)
    assert layer.blocked_rows == 0
    torch.testing.assert_close(layer(x), linear(x), rtol=1e-5, atol=1e-5)


def test_packing_float32_swaps_each_linear_and_shares_its_weights(fresh_lm) -> None:
    model = fresh_lm("llama", **WIDE, tie_word_embeddings=True).to(torch.float32)
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert pack_weights(model) == linears and is_packed(model)
    assert all(type(m) is not torch.nn.Linear for m in model.modules())
    assert isinstance(model.lm_head, WeightFirstLinear)
    assert model.lm_head.weight is model.get_input_embeddings().weight  # still tied
    assert "weight first" in repr(model.lm_head)


def test_float32_is_packed_only_when_asked_for(fresh_lm) -> None:
    model = fresh_lm("llama").to(torch.float32)
    assert apply_packing(model, None) is Kernel.PLAIN and not is_packed(model)
    assert apply_packing(model, Kernel.PACKED) is Kernel.PACKED and is_packed(model)
    assert apply_packing(model, None) is Kernel.PACKED  # already packed
    assert BenchConfig(dtype="float32").setting == "float32"
    assert BenchConfig(dtype="float32", packed_weights=Kernel.PACKED).setting == "float32+packed"


def test_the_cpu_probe_says_whether_packing_works_here(fresh_lm) -> None:
    model = fresh_lm("llama", **WIDE).to(torch.bfloat16)
    if CPU_PROBLEM is None:
        assert packing_problem(model) is None and pack_weights(model) > 0
    else:
        assert packing_problem(model) == CPU_PROBLEM
        with pytest.raises(ValueError, match="model: cannot pack its weights: this "):
            pack_weights(model)
        assert not is_packed(model)


def test_a_cpu_that_cannot_pack_keeps_plain_weights_unless_told_to_pack(fresh_lm, monkeypatch
                                                                        ) -> None:
    """On an AVX2-only CPU oneDNN cannot reorder bfloat16 weights: the default (None) must fall
    back to plain weights, and bench must label its setting plain, not "+packed"."""
    monkeypatch.setattr(packing, "cpu_packing_problem",
                        lambda dtype=torch.bfloat16: "this CPU cannot (a test)")
    model = fresh_lm("llama").to(torch.bfloat16)
    assert apply_packing(model, None) is Kernel.PLAIN and not is_packed(model)
    with pytest.raises(ValueError, match=r"packed_weights: this CPU cannot \(a test\)"):
        apply_packing(model, Kernel.PACKED)
    assert not is_packed(model)
    assert BenchConfig(dtype="bfloat16").setting == "bfloat16"
    assert BenchConfig(dtype="bfloat16", packed_weights=Kernel.PACKED).setting == "bfloat16+packed"


@needs_packing
def test_apply_packing_packs_bfloat16_by_default_and_not_when_told_not_to(fresh_lm) -> None:
    model = fresh_lm("llama").to(torch.bfloat16)
    assert apply_packing(model, Kernel.PLAIN) is Kernel.PLAIN and not is_packed(model)
    assert apply_packing(model, None) is Kernel.PACKED and is_packed(model)


@needs_packing
def test_bench_packs_bfloat16_and_labels_the_setting() -> None:
    # The bundled model is a GGUF: it runs quantized unless de-quantised or packed.
    assert BenchConfig().setting == "quantized"
    assert BenchConfig(packed_weights=Kernel.PACKED).setting == "bfloat16+packed"
    assert BenchConfig(packed_weights=Kernel.PLAIN, dequantize=True).setting == "bfloat16"
    assert BenchConfig(packed_weights=Kernel.PLAIN).setting == "quantized"  # packs nothing
    assert BenchConfig(packed_weights=Kernel.QUANTIZED).kernel is Kernel.QUANTIZED
    assert BenchConfig(dtype="bfloat16").setting == "bfloat16+packed"
    assert BenchConfig(dtype="float32").setting == "float32"  # float32 only when asked
    plan = BenchConfig(methods=("lookahead",), baseline_dtypes=("bfloat16",),
                       dequantize=True).plan()
    assert plan == [("hf", "bfloat16+packed"), ("hf", "bfloat16"),
                    ("lookahead", "bfloat16+packed")]


def test_bench_runs_quantized_only_where_a_gguf_model_can_and_says_so_by_name(
        monkeypatch, tmp_path) -> None:
    # The hub offline, its cache empty: the hub name is found nowhere, so it is no GGUF (and
    # no network is waited for: asking the hub retries for some 20 s where it is unreachable).
    use_hub_cache(monkeypatch, tmp_path / "hub")
    assert BenchConfig(packed_weights="quantized").setting == "quantized"
    with pytest.raises(ValueError, match="packed_weights='quantized': the model is not a GGUF"):
        BenchConfig(model="no/such-folder", packed_weights=Kernel.QUANTIZED)
    with pytest.raises(ValueError, match="packed_weights='quantized': dequantize=True"):
        BenchConfig(packed_weights=Kernel.QUANTIZED, dequantize=True)
    with pytest.raises(ValueError, match="packed_weights must be None .*got 'yes'"):
        BenchConfig(packed_weights="yes")


def test_bench_summary_takes_the_best_plain_baseline_and_checks_the_packed_one() -> None:
    def record(method, dtype, tokens, seconds):
        return dict(dataset="d", prompt="p", method=method, dtype=dtype, tokens=tokens,
                    new_tokens=len(tokens), seconds=seconds, time_to_first_token=0.1, steps=4,
                    stats=None)

    rows = summarise({}, [
        record("hf", "bfloat16+packed", [1, 2, 3, 4], 1.0),  # 4 tok/s
        record("hf", "bfloat16", [1, 2, 3, 5], 2.0),  # 2 tok/s, another output
        record("lookahead", "bfloat16+packed", [1, 2, 3, 4], 0.5),  # 8 tok/s
    ])["summary"]["d"]
    by_key = {(r["method"], r["dtype"]): r for r in rows}
    packed_hf, ours = by_key[("hf", "bfloat16+packed")], by_key[("lookahead", "bfloat16+packed")]
    assert ours["speedup"] == pytest.approx(2.0)  # over HF on the same packed weights
    assert ours["speedup_vs_best_baseline"] == pytest.approx(4.0)  # over plain bf16 HF
    assert ours["best_baseline_dtype"] == "bfloat16"
    assert packed_hf["identical"] == 0  # checked against the plain weights' output
    assert by_key[("hf", "bfloat16")]["identical"] is None
