"""lookahead.kernels.row_ops: the norm and the gated product give PyTorch's values, each row
the bits it gets alone; fuse_row_ops swaps only what computes the same."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings
from hypothesis import strategies as st
from test_quant_linear import layer

from lookahead.kernels.row_ops import (GatedMLP, RowRMSNorm, built_argmax, built_top_k,
                                       fuse_row_ops, load_row_ops)
from lookahead.proposers.recycling import top_k
from lookahead.verify import ARGMAX_BLOCK, argmax


class LlamaStyleRMSNorm(torch.nn.Module):
    """transformers' Llama/Qwen2 RMSNorm."""

    def __init__(self, weight: torch.Tensor, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.variance_epsilon = torch.nn.Parameter(weight), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


class GemmaStyleRMSNorm(LlamaStyleRMSNorm):
    """Scales by 1 + weight: looks like the other, computes something else."""

    def forward(self, x):
        return super().forward(x) / self.weight * (1.0 + self.weight)


class SiLUActivation(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.silu(x)


class Mlp(torch.nn.Module):
    def __init__(self, gate, up, down, swapped: bool = False) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate, up, down
        self.act_fn, self.swapped = SiLUActivation(), swapped

    def forward(self, x):
        if self.swapped:  # silu on the wrong half
            return self.down_proj(self.gate_proj(x) * self.act_fn(self.up_proj(x)))
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize("width", [64, 40, 1536])
def test_the_norm_gives_torch_values_and_each_row_its_own_bits(width):
    generator = torch.Generator().manual_seed(width)
    x = torch.randn(7, width, generator=generator) * 3
    weight = torch.rand(width, generator=generator) + 0.5
    ours = RowRMSNorm(weight, 1e-6)(x)
    torch.testing.assert_close(ours, LlamaStyleRMSNorm(weight)(x), rtol=1e-6, atol=1e-6)
    for row in range(7):
        assert torch.equal(RowRMSNorm(weight, 1e-6)(x[row:row + 1]), ours[row:row + 1])
    assert RowRMSNorm(weight, 1e-6)(x.reshape(7, 1, width)).shape == (7, 1, width)


def test_the_gated_product_gives_torch_values_and_each_row_its_own_bits():
    silu_mul = load_row_ops().silu_mul
    generator = torch.Generator().manual_seed(0)
    gate, up = torch.randn(5, 300, generator=generator) * 4, torch.randn(5, 300, generator=generator)
    gate[0, :4] = torch.tensor([-1000.0, 1000.0, 0.0, -90.0])  # far past exp's range: no NaN
    ours = silu_mul(gate, up)
    torch.testing.assert_close(ours, torch.nn.functional.silu(gate) * up, rtol=2e-6, atol=1e-6)
    assert torch.isfinite(ours).all()
    for row in range(5):
        assert torch.equal(silu_mul(gate[row:row + 1], up[row:row + 1]), ours[row:row + 1])
    with pytest.raises(RuntimeError, match="gate must be contiguous float32"):
        silu_mul(gate.double(), up)
    with pytest.raises(RuntimeError, match="gate and up must have one shape"):
        silu_mul(gate, up[:, :5].contiguous())


def test_only_modules_that_compute_the_same_are_swapped():
    hidden, inner = 256, 512
    weight = torch.rand(hidden, generator=torch.Generator().manual_seed(0)) + 0.5

    def mlp(swapped=False):
        return Mlp(layer(Q.Q4_K, inner, hidden, seed=1), layer(Q.Q4_K, inner, hidden, seed=2),
                   layer(Q.Q4_K, hidden, inner, seed=3), swapped)

    model = torch.nn.ModuleDict({
        "norm": LlamaStyleRMSNorm(weight.clone()), "gemma": GemmaStyleRMSNorm(weight.clone()),
        "mlp": mlp(), "swapped": mlp(swapped=True),
        "mixed": Mlp(layer(Q.Q4_K, inner, hidden), layer(Q.Q6_K, inner, hidden),
                     layer(Q.Q4_K, hidden, inner))})
    x = torch.randn(2, hidden, generator=torch.Generator().manual_seed(1))
    before = {name: module(x) for name, module in model.items()}
    assert fuse_row_ops(model) == {"norms": 1, "mlps": 2}
    assert isinstance(model["norm"], RowRMSNorm) and isinstance(model["mlp"], GatedMLP)
    assert type(model["gemma"]) is GemmaStyleRMSNorm and type(model["swapped"]) is Mlp
    assert isinstance(model["mixed"], GatedMLP)  # a Q4_K gate beside a Q6_K up
    torch.testing.assert_close(model["mixed"](x), before["mixed"], rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(model["norm"](x), before["norm"], rtol=1e-5, atol=1e-6)
    assert (model["mlp"](x) - before["mlp"]).norm() <= 1e-3 * before["mlp"].norm()


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 4), vocab=st.integers(1, 3 * 16 * 16 + 5), levels=st.integers(1, 6),
       seed=st.integers(0, 2**31 - 1),
       specials=st.lists(st.sampled_from(["nan", "inf", "-inf"]), max_size=3))
def test_the_compiled_argmax_is_torch_argmax_with_ties_nan_and_infinities(rows, vocab, levels,
                                                                          seed, specials):
    generator = torch.Generator().manual_seed(seed)
    # few distinct values: many ties across the 16 lanes, so the first maximum must be found
    logits = torch.randint(0, levels, (rows, vocab), generator=generator).float()
    for special in specials:
        at = torch.randint(0, rows * vocab, (1,), generator=generator).item()
        logits.view(-1)[at] = float(special)
    assert torch.equal(load_row_ops().argmax(logits), torch.argmax(logits, dim=-1))


def test_verify_argmax_takes_the_compiled_pass_once_the_row_ops_are_built():
    load_row_ops()
    assert built_argmax() is load_row_ops().argmax
    logits = torch.randn(3, 2, 5 * ARGMAX_BLOCK + 7)
    logits[1, 0, 17] = logits[1, 0, 600] = 1e9  # a tie: the first one
    assert torch.equal(argmax(logits), logits.argmax(-1))
    strided = torch.randn(4 * ARGMAX_BLOCK + 1, 6).t()  # rows not contiguous: copied
    assert torch.equal(argmax(strided), strided.argmax(-1))
    with pytest.raises(RuntimeError, match="logits must be float32"):
        load_row_ops().argmax(torch.zeros(2, 5, dtype=torch.float64))


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 4), vocab=st.integers(1, 3 * 16 * 16 + 5), k=st.integers(1, 64),
       levels=st.integers(1, 40), seed=st.integers(0, 2**31 - 1),
       specials=st.lists(st.sampled_from(["nan", "inf", "-inf"]), max_size=3))
def test_the_compiled_top_k_is_a_stable_descending_sort_with_nan_as_lowest(rows, vocab, k,
                                                                           levels, seed,
                                                                           specials):
    k = min(k, vocab)
    generator = torch.Generator().manual_seed(seed)
    # few distinct values: many ties, which must come in the order of their indices
    scores = torch.randint(0, levels, (rows, vocab), generator=generator).float()
    for special in specials:
        at = torch.randint(0, rows * vocab, (1,), generator=generator).item()
        scores.view(-1)[at] = float(special)
    inf = float("inf")
    expected = torch.sort(scores.nan_to_num(nan=-inf, posinf=inf, neginf=-inf),
                          dim=-1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(load_row_ops().top_k(scores, k), expected)


def test_recycling_takes_the_compiled_top_k_once_built_and_bad_calls_are_refused():
    load_row_ops()
    assert built_top_k() is load_row_ops().top_k
    scores = torch.randn(3, 1000)
    assert torch.equal(top_k(scores, 8), torch.topk(scores, 8).indices)
    assert torch.equal(top_k(scores.double(), 8), torch.topk(scores, 8).indices)  # torch's
    with pytest.raises(RuntimeError, match="k must be in 1 .. min"):
        load_row_ops().top_k(scores, 0)
    with pytest.raises(RuntimeError, match="k must be in 1 .. min"):
        load_row_ops().top_k(scores[:, :5], 6)
    with pytest.raises(RuntimeError, match="scores must be float32"):
        load_row_ops().top_k(scores.double(), 2)
