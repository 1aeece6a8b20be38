"""The GGUF types added to the integer kernel after the first six (Q5_1, IQ4_NL, Q2_K, Q3_K,
Q5_K, IQ4_XS): their blocks taken bit for bit, the kernel's sums equal to the reference's on
every build, and one warning for the linears that a load still de-quantises.

``tests/unit/test_quant_linear.py`` runs its checks over every type too; these tests pin the
new types by name (a hypothesis draw over twelve types may skip one) and from blocks of the
shapes real files hold.
"""

from __future__ import annotations

import logging

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from test_quant_linear import ISAS, layer, needs_kernel, random_raw
from tiny_gguf import write_tiny_gguf

from lookahead.kernels import quant_formats as qf
from lookahead.kernels.quant_linear import QuantLinear, supported_qtypes
from lookahead.models.gguf_quantized import DequantisingLinear, load_gguf_quantized

NEW = [qf.Q5_1, qf.IQ4_NL, qf.Q2_K, qf.Q3_K, qf.Q5_K, qf.IQ4_XS]
NAMES = {t: qf.FORMATS[t].name for t in NEW}


def test_the_new_types_are_taken_and_named_as_gguf_names_them():
    assert set(NEW) <= supported_qtypes()
    for qtype in NEW:
        fmt = qf.FORMATS[qtype]
        assert fmt.name == Q(qtype).name
        assert (fmt.block, fmt.type_size) == gguf.GGML_QUANT_SIZES[Q(qtype)]
    assert qf.IQ4_LEVELS == tuple(gguf.quants.IQ4_NL.kvalues)


@pytest.mark.parametrize("qtype", NEW, ids=NAMES.get)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weights_equal_gguf_dequantize_bit_for_bit(qtype, seed):
    """Random blocks (gguf.quants.quantize of Gaussian weights where gguf can, Q5_1; else
    random bytes with finite float16 scales): parse -> pack -> unpack gives exact values that
    round to gguf's float32 for every weight, and every quant value occurs."""
    width = 1024 if qf.FORMATS[qtype].block == 256 else 320
    raw = random_raw(qtype, 33, width, seed, from_floats=True)
    expected = gguf.quants.dequantize(raw, Q(qtype))
    module = QuantLinear(torch.from_numpy(raw), qtype, width, kernel=False)
    assert torch.equal(module.dequantized().to(torch.float32), torch.from_numpy(expected))
    parts = qf.unpack(module.records, qtype, 33)
    top = {qf.Q2_K: 3, qf.Q3_K: 7, qf.Q5_1: 31, qf.Q5_K: 31}.get(qtype, 15)
    assert parts.q.min() == 0 and parts.q.max() == top


@pytest.mark.parametrize("qtype", [qf.Q3_K, qf.IQ4_XS], ids=NAMES.get)
def test_signed_scales_keep_their_sign(qtype):
    """Q3_K's and IQ4_XS's 6-bit scales less 32 are negative for stored values under 32:
    a block whose scale bits are all zero de-quantises to -32 * d * value."""
    raw = random_raw(qtype, 16, 256, 5, from_floats=False)
    blocks = raw.reshape(16, -1, qf.FORMATS[qtype].type_size)
    if qtype == qf.Q3_K:
        blocks[..., 96:108] = 0
    else:
        blocks[..., 2:8] = 0
    parts = qf.parse(raw, qtype)
    assert (parts.sc == -32).all()
    expected = gguf.quants.dequantize(raw, Q(qtype))
    weights = QuantLinear(torch.from_numpy(raw), qtype, 256, kernel=False).dequantized()
    assert torch.equal(weights.to(torch.float32), torch.from_numpy(expected))


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", NEW, ids=NAMES.get)
def test_kernel_sums_are_the_reference_bits(isa, qtype):
    """1 to 13 rows (the tile of 8 and past it) over 3 blocks and 37 outputs (a partial group
    of 16; an odd count of groups, so that the kernels of two groups leave one group to the
    kernel of one): the kernel's float32 sums equal the reference's, compared as int32."""
    fmt = qf.FORMATS[qtype]
    for seed, from_floats in ((0, True), (1, False)):
        module = layer(qtype, 37, 3 * fmt.block, seed, from_floats, kernel=True, isa=isa)
        x = torch.randn(13, module.in_features, generator=torch.Generator().manual_seed(seed))
        x[2] *= 1e-3   # a row of small activations
        for rows in (1, 2, 3, 4, 5, 6, 7, 8, 13):
            sums = module.kernel_sums(x[:rows])
            expected = module.reference(x[:rows])
            assert torch.equal(sums.view(torch.int32), expected.view(torch.int32)), rows


def test_a_load_warns_once_naming_the_types_left_de_quantised(tmp_path, caplog):
    """A file whose linears are half of a type the factory does not take: one warning naming
    the type and the count, and those linears become float nn.Linear of gguf's values."""
    path = write_tiny_gguf(tmp_path / "mixed.gguf", "llama", (Q.TQ2_0, Q.Q4_K), hidden=256)
    taken = {int(Q.Q4_K)}
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        model, _ = load_gguf_quantized(path, DequantisingLinear, torch.float32,
                                       supported_qtypes=taken)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    floats = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert len(warnings) == 1, warnings
    # the tied output layer reads the embedding's TQ2_0 rows: 7 of 14 layer linears + 1
    assert len(floats) == 8
    assert warnings[0] == ("8 tensors of types TQ2_0 de-quantised to float32 (no integer "
                           "kernel for them)")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        load_gguf_quantized(path, DequantisingLinear, torch.float32,
                            supported_qtypes={int(Q.Q4_K), int(Q.TQ2_0)})
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_the_warning_lists_several_types_in_order(tmp_path, caplog):
    path = write_tiny_gguf(tmp_path / "three.gguf", "qwen2", (Q.TQ2_0, Q.Q4_K, Q.TQ1_0),
                           hidden=256)
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        model, _ = load_gguf_quantized(path, DequantisingLinear, torch.float32,
                                       supported_qtypes={int(Q.Q4_K)})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    floats = sum(type(m) is torch.nn.Linear for m in model.modules())
    expected = (f"{floats} tensors of types TQ1_0, TQ2_0 de-quantised to float32 (no integer "
                "kernel for them)")
    assert warnings == [expected]
    assert floats == 10   # of the 15 linears, those not Q4_K
