"""Quantized linear layers (``lookahead.kernels.quant_linear``): GGUF blocks taken losslessly,
a PyTorch reference within the activation quantization's computed error of the exact
product, a compiled kernel (AVX512-VNNI and AVX2 builds) that gives the reference's bits, and
each row's result independent of the rows beside it.

The kernel is compiled on first use: without a C++ compiler or an x86-64 CPU with AVX2 the
kernel tests skip, and say why; the reference tests run everywhere.
"""

from __future__ import annotations

import copy
import logging

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead.kernels import quant_formats as qf
from lookahead.kernels import quant_linear as ql
from lookahead.kernels.quant_linear import (
    QuantLinear,
    quant_kernel_problem,
    supported_qtypes,
)

QTYPES = sorted(supported_qtypes())
NAMES = {t: qf.FORMATS[t].name for t in QTYPES}
# byte offsets of the float16 scales in each GGUF block (random bytes there could be NaN)
HALF_FIELDS = {qf.Q4_0: [0], qf.Q4_1: [0, 2], qf.Q5_0: [0], qf.Q5_1: [0, 2], qf.Q8_0: [0],
               qf.IQ4_NL: [0], qf.Q2_K: [80, 82], qf.Q3_K: [108], qf.Q4_K: [0, 2],
               qf.Q5_K: [0, 2], qf.Q6_K: [208], qf.IQ4_XS: [0]}
ISAS = [isa for isa in ql.ISA_FLAGS if quant_kernel_problem(isa) is None]
needs_kernel = pytest.mark.skipif(not ISAS, reason=str(quant_kernel_problem()))


def random_raw(qtype: int, out: int, width: int, seed: int, from_floats: bool) -> np.ndarray:
    """GGUF rows uint8 [out, row_bytes]: ``gguf.quants.quantize`` of Gaussian weights where
    it supports the type (from_floats), else random bytes with finite float16 scales."""
    rng = np.random.default_rng(seed)
    fmt = qf.FORMATS[qtype]
    if from_floats:
        try:
            weights = rng.standard_normal((out, width)).astype(np.float32)
            return gguf.quants.quantize(weights, gguf.GGMLQuantizationType(qtype))
        except NotImplementedError:
            pass
    raw = rng.integers(0, 256, (out, width // fmt.block * fmt.type_size), dtype=np.uint8)
    blocks = raw.reshape(out, -1, fmt.type_size)
    for at in HALF_FIELDS[qtype]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype(np.float16)
        blocks[..., at:at + 2] = scales[..., None].view(np.uint8)
    return raw


def layer(qtype: int, out: int, width: int, seed: int = 0, from_floats: bool = True,
          **kwargs) -> QuantLinear:
    raw = torch.from_numpy(random_raw(qtype, out, width, seed, from_floats))
    return QuantLinear(raw, qtype, width, **kwargs)


@pytest.mark.parametrize("qtype", QTYPES, ids=NAMES.get)
@pytest.mark.parametrize("from_floats", [True, False])
def test_weights_are_gguf_values_exactly(qtype, from_floats):
    # parse -> pack -> unpack loses nothing: the exact values round to gguf's float32
    raw = random_raw(qtype, 37, 512, seed=1, from_floats=from_floats)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype))
    weights = QuantLinear(torch.from_numpy(raw), qtype, 512, kernel=False).dequantized()
    assert torch.equal(weights.to(torch.float32), torch.from_numpy(expected))


@settings(max_examples=20, deadline=None)
@given(qtype=st.sampled_from(QTYPES), groups=st.integers(1, 3), extra=st.integers(0, 15),
       blocks=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_pack_unpack_round_trip(qtype, groups, extra, blocks, seed):
    fmt = qf.FORMATS[qtype]
    out, width = groups * 16 - extra, blocks * fmt.block
    parts = qf.parse(random_raw(qtype, out, width, seed, from_floats=False), qtype)
    records = qf.pack(parts, qtype)
    assert records.shape == (groups, blocks, fmt.record_bytes)
    back = qf.unpack(records, qtype, out)
    for field in ("q", "sc", "m", "d", "dmin"):
        a, b = getattr(parts, field), getattr(back, field)
        assert (a is None) == (b is None)
        assert a is None or np.array_equal(a, b), field


def test_bits_per_weight_stay_near_gguf():
    bits = {qf.FORMATS[t].name: qf.FORMATS[t].record_bytes * 8 / (16 * qf.FORMATS[t].block)
            for t in QTYPES}
    assert bits == {"Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5, "Q5_1": 6.0, "Q8_0": 8.5,
                    "IQ4_NL": 4.5, "Q2_K": 3.125, "Q3_K": 3.5625, "Q4_K": 4.625,
                    "Q5_K": 5.625, "Q6_K": 6.5625, "IQ4_XS": 4.3125}


def test_activation_rounding_error_is_half_a_step():
    x = torch.randn(5, 512) * torch.logspace(-3, 2, 512)
    xq, dx, xs = qf.quantize_rows(x, 32, 16)
    step = dx.repeat_interleave(32, dim=1)
    assert (xq.abs() <= 127).all() and (xq.abs().amax(-1) == 127).all()
    assert ((xq * step - x).abs() <= step * (0.5 + 1e-6)).all()
    assert torch.equal(xs, xq.reshape(5, 32, 16).sum(-1))


def error_bound(module: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """|reference - x @ W.T| may reach, [N, O]: each activation's rounding (at most half its
    block's step) times |w|, plus float32 rounding of the block sums: a few ulp per block
    of sum |w| |xq dx| (each block's terms before they cancel)."""
    fmt = qf.FORMATS[module.qtype]
    parts = qf.unpack(module.records, module.qtype, module.out_features)
    xq, dx, _ = qf.quantize_rows(x, fmt.block, fmt.sub)
    step = dx.double().repeat_interleave(fmt.block, dim=1)                    # [N, I]
    weights = qf.dequantize(parts, module.qtype).abs()
    rounding = 0.5 * step @ weights.t() * (1 + 1e-6)
    # each term before cancelling: d * sc * |q - offset| and dmin * m, times |xq| dx
    terms = qf.dequantize(qf.QuantParts(parts.q, parts.sc, None, parts.d, None),
                          module.qtype).abs()
    if parts.m is not None and parts.dmin is not None:
        mins = qf.QuantParts(np.ones_like(parts.q), parts.m, None, np.abs(parts.dmin), None)
        terms = terms + qf.dequantize(mins, module.qtype).abs()
    blocks = module.in_features // fmt.block
    floats = (blocks + 8) * 2.0**-24 * (xq.abs().double() * step) @ terms.t()
    return rounding + floats


@pytest.mark.parametrize("qtype", QTYPES, ids=NAMES.get)
def test_reference_is_within_computed_error_of_float64(qtype):
    module = layer(qtype, 48, 768 if qf.FORMATS[qtype].block == 256 else 544, kernel=False)
    x = torch.randn(6, module.in_features)
    exact = x.double() @ module.dequantized().t()
    error = (module.reference(x).double() - exact).abs()
    bound = error_bound(module, x)
    assert (error <= bound).all(), (error / bound).max()
    assert error.max() > 0   # the bound is not met by an exact product by accident


def test_forward_adds_bias_and_keeps_dtype():
    bias = torch.randn(40)
    module = layer(qf.Q4_K, 40, 256, bias=bias, kernel=False)
    x = torch.randn(2, 3, 256)
    y = module(x)
    assert y.shape == (2, 3, 40) and y.dtype == torch.float32
    assert torch.equal(y, (module.reference(x.reshape(6, 256)) + bias).reshape(2, 3, 40))
    assert module(x.bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize("bad, message", [
    ({"qtype": 1}, "qtype: expected one of"),
    ({"in_features": 100}, "in_features: expected a positive multiple of Q4_K's block"),
    ({"raw": torch.zeros(4, 10, dtype=torch.uint8)}, "raw: expected 144 bytes a row"),
    ({"raw": torch.zeros(4, 144)}, "raw: expected a uint8 tensor"),
    ({"bias": torch.zeros(5)}, r"bias: expected shape \(4,\)"),
])
def test_bad_arguments_name_themselves(bad, message):
    args = {"raw": torch.zeros(4, 144, dtype=torch.uint8), "qtype": qf.Q4_K,
            "in_features": 256, "bias": None} | bad
    with pytest.raises(ValueError, match=message):
        QuantLinear(**args, kernel=False)


def test_without_the_kernel_a_clear_error_or_the_reference(monkeypatch, caplog):
    monkeypatch.setattr(ql.platform, "machine", lambda: "aarch64")
    ql.load_quant_kernel.cache_clear()
    try:
        problem = quant_kernel_problem()
        assert problem is not None and "needs an x86-64 CPU; this is aarch64" in problem
        with pytest.raises(RuntimeError, match="x86-64"):
            layer(qf.Q6_K, 16, 256, kernel=True)
        with caplog.at_level(logging.WARNING):
            module = layer(qf.Q6_K, 16, 256)
        assert "computes in PyTorch instead" in caplog.text and module.isa is None
        x = torch.randn(2, 256)
        assert torch.equal(module(x), module.reference(x))
        with pytest.raises(RuntimeError, match="no kernel"):
            module.kernel_sums(x)
    finally:
        ql.load_quant_kernel.cache_clear()


def one_row_at_a_time(fn, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([fn(x[i:i + 1]) for i in range(x.shape[0])])


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_reference_rows_do_not_depend_on_each_other(rows):
    module = layer(qf.Q4_1, 20, 96, kernel=False)
    x = torch.randn(rows, 96)
    assert torch.equal(module.reference(x), one_row_at_a_time(module.reference, x))


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=25, deadline=None)
@given(qtype=st.sampled_from(QTYPES), out=st.integers(1, 70), blocks=st.integers(1, 3),
       rows=st.integers(1, 27), seed=st.integers(0, 2**16), from_floats=st.booleans())
def test_kernel_gives_the_reference_bits(isa, qtype, out, blocks, rows, seed, from_floats):
    width = blocks * qf.FORMATS[qtype].block
    module = layer(qtype, out, width, seed, from_floats, kernel=True, isa=isa)
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed)) * 3
    sums = module.kernel_sums(x)
    assert torch.equal(sums.view(torch.int32), module.reference(x).view(torch.int32))


@needs_kernel
def test_a_deep_copy_gives_the_same_bits():
    module = layer(qf.Q4_K, 32, 256, kernel=True)
    x = torch.randn(3, 256)
    assert torch.equal(copy.deepcopy(module)(x), module(x))


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_kernel_quantizes_activations_as_the_reference(isa):
    kernel = ql.load_quant_kernel(isa)
    x = torch.randn(7, 512) * torch.logspace(-4, 3, 512)
    x[0, :32] = 0   # a block of zeros: scale 0
    x[1, :32] = torch.arange(32) - 0.5   # with 127 the block's largest: scale 1, ties
    x[1, 31] = 127.0
    for block, sub in ((256, 32), (256, 16), (32, 32)):
        xq, dx, xs = kernel.quantize(x, block, sub)
        rq, rdx, rxs = qf.quantize_rows(x, block, sub)
        assert torch.equal(xq.long(), rq) and torch.equal(dx, rdx) and torch.equal(xs.long(), rxs)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", QTYPES, ids=NAMES.get)
def test_kernel_rows_give_the_bits_of_one_row_passes(isa, qtype):
    fmt = qf.FORMATS[qtype]
    module = layer(qtype, 50, 2 * fmt.block, seed=3, bias=torch.randn(50), kernel=True,
                   isa=isa)
    x = torch.randn(27, module.in_features)
    for rows in (1, 2, 3, 4, 5, 6, 8, 13, 27):
        for dtype in (torch.float32, torch.bfloat16):
            xs = x[:rows].to(dtype)
            together = module(xs)
            assert torch.equal(together, one_row_at_a_time(module, xs)), (rows, dtype)
            # and the forward pass is the reference's, bias and rounding to dtype included
            expected = (module.reference(xs) + module.bias).to(dtype)
            assert torch.equal(together, expected), (rows, dtype)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [qf.Q4_1, qf.Q4_K, qf.Q6_K, qf.Q8_0], ids=NAMES.get)
def test_either_prefetch_hint_gives_the_reference_bits(isa, qtype):
    """Records read once asked for as non-temporal or as usual: the speed may change, the
    bits may not, for a decoding step's rows (one tile) and a prompt's (several)."""
    fmt = qf.FORMATS[qtype]
    x = torch.randn(21, 4 * fmt.block)
    expected = None
    for nontemporal in (True, False):
        module = layer(qtype, 48, 4 * fmt.block, seed=5, kernel=True, isa=isa,
                       nontemporal=nontemporal)
        assert module.nontemporal is nontemporal
        expected = module.reference(x) if expected is None else expected
        for near in (0, 512):  # to L1 alone, or to L2 at 4096 bytes and to L1 at 512
            module.ahead, module.near = 4096, near
            for rows in (1, 4, 8, 21):
                sums = module.kernel_sums(x[:rows])
                assert torch.equal(sums.view(torch.int32), expected[:rows].view(torch.int32))
        copied = module.first_outputs(32)  # a layer made from this one keeps the hints
        assert copied.nontemporal is nontemporal and (copied.ahead, copied.near) == (4096, 512)


def test_the_prefetch_hint_follows_the_cpu_vendor(monkeypatch):
    assert ql.nontemporal_default("GenuineIntel") is False
    assert ql.nontemporal_default("AuthenticAMD") is True
    assert ql.nontemporal_default("") is True
    monkeypatch.setattr(ql, "cpu_vendor", lambda: "GenuineIntel")
    assert layer(qf.Q4_K, 16, 256).nontemporal is False
    monkeypatch.setattr(ql, "cpu_vendor", lambda: "AuthenticAMD")
    assert layer(qf.Q4_K, 16, 256).nontemporal is True


def test_a_prefetch_hint_that_is_not_a_bool_is_refused():
    with pytest.raises(ValueError, match="nontemporal: expected True, False or None, got 'no'"):
        layer(qf.Q4_K, 16, 256, nontemporal="no")


def test_cpu_vendor_is_what_the_cpu_says():
    vendor = ql.cpu_vendor()
    assert isinstance(vendor, str)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            listed = [line.split(":", 1)[1].strip() for line in info
                      if line.startswith("vendor_id")]
    except OSError:
        pytest.skip("no /proc/cpuinfo here")
    if not listed:
        pytest.skip("/proc/cpuinfo lists no vendor_id here")
    assert vendor == listed[0]


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 9), blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_q5_0_layers_hold_gguf_values_at_5_5_bits(rows, blocks, seed) -> None:
    """A Q5_0 weight, (q - 16) * d with q in 0..31, keeps its fifth bit in its own plane: the
    records hold gguf's values exactly in 22 bytes per 32 weights, as the file does."""
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((rows, 32 * blocks)) * rng.uniform(0.01, 3)).astype(np.float32)
    raw = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q5_0)
    layer = QuantLinear(torch.from_numpy(raw), qf.Q5_0, 32 * blocks)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q5_0)
    assert torch.equal(layer.dequantized(), torch.from_numpy(expected).double())
    assert layer.records.numel() == -(-rows // 16) * 16 * blocks * 22


@pytest.mark.parametrize("kernel", [None, False])
def test_first_outputs_share_the_records_and_give_the_first_outputs(kernel):
    whole = layer(qf.Q6_K, 72, 256, bias=torch.randn(72), kernel=kernel)
    part = whole.first_outputs(32)
    assert part.out_features == 32
    assert part.records.data_ptr() == whole.records.data_ptr()  # a view, nothing copied
    x = torch.randn(3, 256)
    assert torch.equal(part(x), whole(x)[:, :32])
    with pytest.raises(ValueError, match="count: expected a positive multiple of 16 up to 72"):
        whole.first_outputs(24)
    with pytest.raises(ValueError, match="count: expected"):
        whole.first_outputs(80)


def test_the_kernel_takes_leading_dimensions_and_the_bias_itself():
    """forward hands [..., I] and the bias to the kernel: the same bits as rows, then + bias."""
    bias = torch.randn(40)
    module = layer(qf.Q4_K, 40, 256, bias=bias)
    if module.isa is None:
        pytest.skip(quant_kernel_problem())
    x = torch.randn(2, 3, 256)
    expected = (module.kernel_sums(x.reshape(6, 256)) + bias).reshape(2, 3, 40)
    assert torch.equal(module(x), expected)
    assert torch.equal(module(x[0, 0]), expected[0, 0])
    with pytest.raises(ValueError, match=r"x: expected \[\.\.\., 256\]"):
        module(torch.randn(2, 128))


def test_several_cpuinfo_fields_read_at_once_are_each_field_alone():
    names = ("model name", "vendor_id", "cpu family", "model", "no such field")
    assert ql.cpuinfo_fields(*names) == tuple(ql.cpuinfo_field(name) for name in names)
    assert ql.cpuinfo_fields("no such field") == ("",)
