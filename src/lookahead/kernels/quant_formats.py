"""GGUF quantized blocks: their integer parts, the kernel's repacked layout, and a reference
product in PyTorch that does the kernel's arithmetic bit for bit.

Every supported type writes a weight as ``w = d * sc * (v(q) - offset) - dmin * m`` over
sub-blocks of ``sub`` inputs, with ``q`` an unsigned integer of 2 to 8 bits, ``v(q) = q``
except for IQ4 (one of 16 levels, ``IQ4_LEVELS[q]``), ``sc`` and ``m`` small integers per
sub-block and ``d``, ``dmin`` float16 per block of ``block`` inputs:

======  =====  ===  ======  ==========================  ====================
type    block  sub  offset  sc, m per sub-block         d, dmin per block
======  =====  ===  ======  ==========================  ====================
Q4_0       32   32       8  1, none                     d
Q4_1       32   32       0  1, 1                        d, -min
Q5_0       32   32      16  1, none                     d
Q5_1       32   32       0  1, 1                        d, -min
Q8_0       32   32     128  1, none                     d (q = stored int8 + 128)
IQ4_NL     32   32       0  1, none                     d (v(q): IQ4_LEVELS)
Q2_K      256   16       0  4-bit, 4-bit                d, dmin
Q3_K      256   16       4  6-bit - 32, none            d
Q4_K      256   32       0  6-bit, 6-bit                d, dmin
Q5_K      256   32       0  6-bit, 6-bit                d, dmin
Q6_K      256   16      32  int8, none                  d
IQ4_XS    256   32       0  6-bit - 32, none            d (v(q): IQ4_LEVELS)
======  =====  ===  ======  ==========================  ====================

The kernel multiplies these exact values: in real arithmetic, ``w`` above is the value
``gguf.quants.dequantize`` rounds to float32 (it rounds ``d * sc * q - dmin * m`` once more).

Layout the kernel reads (``pack``): outputs in groups of 16 (padded with zero rows), and for
each group and block one record of bytes, in this order:

- the quants: for each 8 inputs, 64 bytes, 4 per output; byte ``b`` of output ``l`` holds
  input ``b`` in its low nibble and input ``4 + b`` in its high nibble (Q8_0: for each 4
  inputs, 64 bytes, byte ``b`` of output ``l`` is input ``b``; Q2_K, Q3_K: the two low bits,
  for each 16 inputs 64 bytes, bits ``2k, 2k+1`` of byte ``b`` of output ``l`` belong to input
  ``4k + b``);
- Q6_K only: the quants' two high bits, for each 16 inputs 64 bytes, laid out as Q2_K's;
- Q5_0, Q5_1, Q5_K: the quants' fifth bits, for each 32 inputs 64 bytes; bit ``k`` of byte
  ``b`` of output ``l`` belongs to input ``4k + b``; Q3_K: its third bits, laid out the same;
- K-types only: ``sc`` as bytes [sub-block][16 outputs]; ``m`` as byte pairs
  [sub-block pair][16 outputs][2];
- ``d`` as float16 [16 outputs], then ``dmin`` where the type has one.

Bits per weight (GGUF's in brackets where they differ; the 6-bit scales take a byte each):
Q4_0 4.5, Q4_1 5.0, Q5_0 5.5, Q5_1 6.0, Q8_0 8.5, IQ4_NL 4.5, Q2_K 3.125 (2.625), Q3_K 3.5625
(3.4375), Q4_K 4.625 (4.5), Q5_K 5.625 (5.5), Q6_K 6.5625, IQ4_XS 4.3125 (4.25).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# gguf.GGMLQuantizationType values (gguf is imported only where files are read)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
IQ4_NL, IQ4_XS = 20, 23
LANES = 16  # outputs per group: one AVX-512 register of int32
# IQ4_NL's and IQ4_XS's 16 non-linear levels (ggml's kvalues_iq4nl): a 4-bit quant is an
# index into them
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


@dataclass(frozen=True)
class QuantFormat:
    """How one GGUF type's blocks are laid out and what the kernel does with them."""

    name: str
    block: int         # inputs per GGUF block (and per activation scale)
    type_size: int     # bytes per GGUF block
    sub: int           # inputs per sub-block scale
    offset: int        # subtracted from the unsigned quants
    has_min: bool      # whether a dmin * m term is subtracted
    bits: int          # bits a quant takes in the records: 2, 3, 4, 5, 6 or 8
    signed: bool = False                    # sub-block scales are int8 (else uint8)
    levels: tuple[int, ...] | None = None   # a quant indexes these values (IQ4)

    @property
    def record_bytes(self) -> int:
        """Bytes of one packed record: 16 outputs x ``block`` inputs."""
        # bits a quant takes in the first plane and in the second: 8; 4 (+1, +2); 2 (+1)
        first = 8 if self.bits == 8 else (2 if self.bits <= 3 else 4)
        quants = self.block * LANES * first // 8
        high = self.block * LANES * (self.bits - first) // 8
        subs = self.block // self.sub
        scales = subs * LANES * (2 if self.has_min else 1) if self.block > 32 else 0
        return quants + high + scales + LANES * 2 * (2 if self.has_min else 1)


FORMATS = {
    Q4_0: QuantFormat("Q4_0", 32, 18, 32, 8, False, 4),
    Q4_1: QuantFormat("Q4_1", 32, 20, 32, 0, True, 4),
    Q5_0: QuantFormat("Q5_0", 32, 22, 32, 16, False, 5),
    Q5_1: QuantFormat("Q5_1", 32, 24, 32, 0, True, 5),
    Q8_0: QuantFormat("Q8_0", 32, 34, 32, 128, False, 8),
    IQ4_NL: QuantFormat("IQ4_NL", 32, 18, 32, 0, False, 4, levels=IQ4_LEVELS),
    Q2_K: QuantFormat("Q2_K", 256, 84, 16, 0, True, 2),
    Q3_K: QuantFormat("Q3_K", 256, 110, 16, 4, False, 3, signed=True),
    Q4_K: QuantFormat("Q4_K", 256, 144, 32, 0, True, 4),
    Q5_K: QuantFormat("Q5_K", 256, 176, 32, 0, True, 5),
    Q6_K: QuantFormat("Q6_K", 256, 210, 16, 32, False, 6, signed=True),
    IQ4_XS: QuantFormat("IQ4_XS", 256, 136, 32, 0, False, 4, signed=True, levels=IQ4_LEVELS),
}


@dataclass
class QuantParts:
    """The integers and scales of a quantized weight [out, in].

    q: uint8 [out, in], unsigned quants; sc: int [out, in / sub]; m: int [out, in / sub] or
    None; d, dmin: float32 [out, in / block] (dmin None without a min term).
    """

    q: np.ndarray
    sc: np.ndarray
    m: np.ndarray | None
    d: np.ndarray
    dmin: np.ndarray | None


def _f16(raw: np.ndarray) -> np.ndarray:
    """uint8 [..., 2] -> float32 [...]: the float16 those two bytes store."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray, group: int) -> np.ndarray:
    """Bytes [..., n * group] whose low nibbles are the first ``group`` values of each span
    of 2 * group and high nibbles the next ``group`` -> uint8 [..., 2 * n * group]."""
    spans = qs.reshape(*qs.shape[:-1], -1, 1, group)
    return ((spans >> np.array([0, 4], np.uint8).reshape(2, 1)) & 15).reshape(
        *qs.shape[:-1], -1)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes of 6-bit scales and mins -> two uint8 [..., 8] (as gguf unpacks)."""
    d, m, m_d = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _bits(packed: np.ndarray, count: int, width: int) -> np.ndarray:
    """uint8 [..., width / count * ...]: bit ``k`` (0 .. 8 / width - 1) of byte ``l`` of each
    span of ``count`` bytes holds value ``k * count + l`` -> uint8 [..., values], the
    ``width``-bit values in order (gguf's layout of Q5_K's, Q3_K's, Q2_K's bit planes)."""
    shifts = (width * np.arange(8 // width, dtype=np.uint8)).reshape(-1, 1)
    spans = packed.reshape(*packed.shape[:-1], -1, 1, count)
    return ((spans >> shifts) & ((1 << width) - 1)).reshape(*packed.shape[:-1], -1)


def _parse_small(blocks: np.ndarray, qtype: int) -> QuantParts:
    """Blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), [out, n, type_size] -> parts."""
    out = blocks.shape[0]
    ones = np.ones(blocks.shape[:2], np.int64)
    d = _f16(blocks[..., 0:2])
    if qtype == Q8_0:
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return QuantParts(q.reshape(out, -1), ones, None, d, None)
    # Q4_1, Q5_1: d[2] m[2] ...; a weight is d * q + m: dmin = -m
    head = 4 if qtype in (Q4_1, Q5_1) else 2
    dmin = -_f16(blocks[..., 2:4]) if head == 4 else None
    if qtype in (Q5_0, Q5_1):   # ... qh[4] qs[16]: weight j's fifth bit is bit j of qh
        qh = blocks[..., head:head + 4].copy().view("<u4")                 # [out, n, 1]
        high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        q = _nibbles(blocks[..., head + 4:], 16) | (high << 4)
    else:
        q = _nibbles(blocks[..., head:], 16)
    return QuantParts(q.reshape(out, -1), ones, None if dmin is None else ones, d, dmin)


def _parse_k32(blocks: np.ndarray, qtype: int) -> QuantParts:
    """Blocks of 256 in sub-blocks of 32 (Q4_K, Q5_K, IQ4_XS) -> parts."""
    out = blocks.shape[0]
    d = _f16(blocks[..., 0:2])
    if qtype == IQ4_XS:   # d[2] scales_h[2] scales_l[4] qs[128]; scale = 6 bits - 32
        high = blocks[..., 2:4].copy().view("<u2")                          # [out, n, 1]
        high = (high >> (2 * np.arange(8, dtype=np.uint16))) & 3
        low = _nibbles(blocks[..., 4:8], 1)
        sc = (low | (high.astype(np.uint8) << 4)).astype(np.int64) - 32
        q = _nibbles(blocks[..., 8:], 16).reshape(out, -1)
        return QuantParts(q, sc.reshape(out, -1), None, d, None)
    sc, mn = _k_scales(blocks[..., 4:16])
    q = _nibbles(blocks[..., -128:], 32)
    if qtype == Q5_K:     # d[2] dmin[2] scales[12] qh[32] qs[128]
        q = q | (_bits(blocks[..., 16:48], 32, 1) << 4)
    return QuantParts(q.reshape(out, -1), sc.reshape(out, -1).astype(np.int64),
                      mn.reshape(out, -1).astype(np.int64), d, _f16(blocks[..., 2:4]))


def _parse_k16(blocks: np.ndarray, qtype: int) -> QuantParts:
    """Blocks of 256 in sub-blocks of 16 (Q2_K, Q3_K, Q6_K) -> parts."""
    out = blocks.shape[0]
    if qtype == Q2_K:     # scales[16] qs[64] d[2] dmin[2]; a byte: scale | min << 4
        q = _bits(blocks[..., 16:80], 32, 2).reshape(out, -1)
        scales = blocks[..., 0:16].astype(np.int64)
        return QuantParts(q, (scales & 15).reshape(out, -1), (scales >> 4).reshape(out, -1),
                          _f16(blocks[..., 80:82]), _f16(blocks[..., 82:84]))
    if qtype == Q3_K:     # hmask[32] qs[64] scales[12] d[2]; q - 4 with q = low | high << 2
        q = _bits(blocks[..., 32:96], 32, 2) | (_bits(blocks[..., 0:32], 32, 1) << 2)
        packed = blocks[..., 96:108]
        low = _nibbles(packed[..., 0:8], 8)
        high = _bits(packed[..., 8:12], 4, 2)
        sc = (low | (high << 4)).astype(np.int64) - 32
        return QuantParts(q.reshape(out, -1), sc.reshape(out, -1), None,
                          _f16(blocks[..., 108:110]), None)
    # Q6_K: ql[128] qh[64] scales[16] d[2]; each half of 128 inputs takes 64 ql, 32 qh bytes
    ql = _nibbles(blocks[..., 0:128], 64)                      # [out, n, 256]
    qh = blocks[..., 128:192].reshape(out, -1, 2, 1, 32) >> np.array(
        [0, 2, 4, 6], np.uint8).reshape(4, 1)
    q = ql | ((qh & 3).reshape(out, -1, 256) << 4)
    sc = blocks[..., 192:208].view(np.int8).astype(np.int64)
    return QuantParts(q.reshape(out, -1), sc.reshape(out, -1), None,
                      _f16(blocks[..., 208:210]), None)


def parse(raw: np.ndarray, qtype: int) -> QuantParts:
    """GGUF rows, uint8 [out, row_bytes] -> their integer parts (see ``QuantParts``)."""
    fmt = FORMATS[qtype]
    blocks = raw.reshape(raw.shape[0], -1, fmt.type_size)
    if fmt.block == 32:
        return _parse_small(blocks, qtype)
    return (_parse_k32 if fmt.sub == 32 else _parse_k16)(blocks, qtype)


def _lanes(a: np.ndarray, groups: int, blocks: int) -> np.ndarray:
    """[out_padded, blocks * k] -> [groups, blocks, k, 16]: per record, output-minor."""
    return a.reshape(groups, LANES, blocks, -1).transpose(0, 2, 3, 1)


def _planes(v: np.ndarray, width: int) -> np.ndarray:
    """Values of ``width`` bits (4, 2 or 1), uint8 [g, 16, n, block] -> their bytes
    [g, n, spans, 16, 4]: a span of 32 / width * 4 inputs per output fills 4 bytes, and
    field ``k`` of byte ``b`` holds the span's input ``4k + b``."""
    g, lanes, n, _ = v.shape
    fields = 8 // width
    spans = v.reshape(g, lanes, n, -1, fields, 4) << (
        width * np.arange(fields, dtype=np.uint8)).reshape(fields, 1)
    return np.bitwise_or.reduce(spans, axis=4).transpose(0, 2, 3, 1, 4)


def pack(parts: QuantParts, qtype: int) -> torch.Tensor:
    """Integer parts -> the kernel's records, uint8 [groups, blocks, record_bytes]."""
    fmt = FORMATS[qtype]
    out, width = parts.q.shape
    padded = -(-out // LANES) * LANES

    def pad(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a, np.zeros((padded - out, *a.shape[1:]), a.dtype)])

    groups, blocks = padded // LANES, width // fmt.block
    q = pad(parts.q).reshape(groups, LANES, blocks, fmt.block)
    if fmt.bits == 8:   # [g, l, n, block/4, 4] -> [g, n, block/4, l, 4]
        pieces = [q.reshape(groups, LANES, blocks, -1, 4).transpose(0, 2, 3, 1, 4)]
    elif fmt.bits <= 3:   # Q2_K, Q3_K: two bits, then Q3_K's third
        pieces = [_planes(q & 3, 2)] + ([_planes(q >> 2, 1)] if fmt.bits == 3 else [])
    else:   # nibbles, then Q5's fifth bits or Q6_K's two high bits
        pieces = [_planes(q & 15, 4)] + ([_planes(q >> 4, fmt.bits - 4)] if fmt.bits > 4
                                         else [])
    if fmt.block > 32:
        pieces.append(_lanes(pad(parts.sc).astype(np.uint8), groups, blocks))
        if fmt.has_min:
            pairs = _lanes(pad(parts.m).astype(np.uint8), groups, blocks)   # [g, n, 8, 16]
            pieces.append(pairs.reshape(groups, blocks, -1, 2, LANES).transpose(0, 1, 2, 4, 3))
    for scale in (parts.d, parts.dmin):
        if scale is not None:
            half = _lanes(pad(scale).astype(np.float16), groups, blocks)
            pieces.append(np.ascontiguousarray(half).view(np.uint8))
    flat = [p.reshape(groups, blocks, -1).astype(np.uint8, copy=False) for p in pieces]
    records = np.concatenate(flat, axis=-1)
    assert records.shape[-1] == fmt.record_bytes, (records.shape, fmt)
    return torch.from_numpy(np.ascontiguousarray(records))


def unpack(records: torch.Tensor, qtype: int, out_features: int) -> QuantParts:
    """The kernel's records, uint8 [groups, blocks, record_bytes] -> the integer parts of
    the first ``out_features`` outputs (the inverse of ``pack``)."""
    fmt = FORMATS[qtype]
    r = records.numpy()
    groups, blocks, _ = r.shape
    at = 0

    def take(size: int) -> np.ndarray:
        nonlocal at
        at += size
        return r[..., at - size:at]

    def rows(a: np.ndarray, *inner: int) -> np.ndarray:
        """[g, n, k..., 16, inner...] -> [g * 16, n * k * prod(inner)]."""
        a = a.reshape(groups, blocks, -1, LANES, *inner)
        a = np.moveaxis(a, 3, 1)
        return a.reshape(groups * LANES, -1)

    def plane(width: int) -> np.ndarray:
        """The next plane of ``width``-bit fields (``_planes``) -> uint8 [g * 16, n * block]."""
        fields = 8 // width
        packed = take(fmt.block * LANES * width // 8).reshape(groups, blocks, -1, LANES, 1, 4)
        shifts = (width * np.arange(fields, dtype=np.uint8)).reshape(fields, 1)
        return rows((packed >> shifts) & ((1 << width) - 1), fields, 4)

    if fmt.bits == 8:
        q = rows(take(fmt.block * LANES), 4)
    elif fmt.bits <= 3:
        q = plane(2)
        q = q | (plane(1) << 2) if fmt.bits == 3 else q
    else:
        q = plane(4)
        q = q | (plane(fmt.bits - 4) << 4) if fmt.bits > 4 else q
    subs = fmt.block // fmt.sub
    ones = np.ones((groups * LANES, blocks), np.int64)
    sc, m = ones, (ones if fmt.has_min else None)
    if fmt.block > 32:
        raw_sc = take(subs * LANES)
        sc = rows(raw_sc.view(np.int8) if fmt.signed else raw_sc, 1).astype(np.int64)
        if fmt.has_min:
            m = rows(take(subs * LANES).reshape(groups, blocks, -1, LANES, 2), 2).astype(
                np.int64)
    d = rows(np.ascontiguousarray(take(2 * LANES)).view(np.float16), 1).astype(np.float32)
    dmin = None
    if fmt.has_min:
        dmin = rows(np.ascontiguousarray(take(2 * LANES)).view(np.float16), 1).astype(
            np.float32)
    keep = slice(0, out_features)
    return QuantParts(q[keep], sc[keep], None if m is None else m[keep], d[keep],
                      None if dmin is None else dmin[keep])


def quantize_rows(x: torch.Tensor, block: int, sub: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of activations as int8 per block, as the kernel quantizes them.

    x: float32 [N, I] -> (xq int64 [N, I] in [-127, 127], dx float32 [N, I / block],
    xs int64 [N, I / sub], the sums of xq per sub-block). x ~= xq * dx per block; the scale
    is amax / 127 and each value rounds half to even, as the kernel's vcvtps2dq does.
    """
    n, width = x.shape
    blocks = x.reshape(n, width // block, block)
    amax = blocks.abs().amax(-1)
    # tensor / tensor divides in IEEE float32, as the C++ does (a Python scalar on the left
    # would multiply by a reciprocal instead, rounding twice)
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    dx = amax / torch.full_like(amax, 127.0)
    xq = torch.round(blocks * inverse[..., None]).clamp_(-127, 127).to(torch.int64)
    xs = xq.reshape(n, width // sub, sub).sum(-1)
    return xq.reshape(n, width), dx, xs


def _values(q: np.ndarray, fmt: QuantFormat) -> torch.Tensor:
    """The quants uint8 [out, in] as float64 [out, in]: IQ4's looked up in its levels."""
    if fmt.levels is not None:
        q = np.asarray(fmt.levels, np.int64)[q]
    return torch.from_numpy(q.astype(np.float64))


def reference_linear(parts: QuantParts, qtype: int, x: torch.Tensor) -> torch.Tensor:
    """x: float32 [N, I] -> float32 [N, O], with the kernel's integer sums and its float
    operations in its order: per block ``((isum * d) - (msum * dmin)) * dx``, added to the
    row's sum (from +0) block after block. parts: the weight's, as ``parse`` or ``unpack``
    gives them."""
    fmt = FORMATS[qtype]
    out, width = parts.q.shape
    blocks, subs = width // fmt.block, fmt.block // fmt.sub
    xq, dx, xs = quantize_rows(x, fmt.block, fmt.sub)
    # float64 sums of integers stay exact (all under 2^53), whatever order einsum takes
    q = _values(parts.q, fmt).reshape(out, blocks, subs, fmt.sub)
    xs64 = xs.to(torch.float64).reshape(-1, blocks, subs)
    dots = torch.einsum("onjs,rnjs->ronj", q, xq.to(torch.float64).reshape(
        -1, blocks, subs, fmt.sub)) - fmt.offset * xs64[:, None]
    sc = torch.from_numpy(parts.sc).to(torch.float64).reshape(out, blocks, subs)
    isum = (dots * sc).sum(-1).to(torch.float32)                      # [N, O, blocks]
    t = isum * torch.from_numpy(parts.d)
    if parts.m is not None and parts.dmin is not None:
        m = torch.from_numpy(parts.m).to(torch.float64).reshape(out, blocks, subs)
        msum = torch.einsum("onj,rnj->ron", m, xs64).to(torch.float32)
        t = t - msum * torch.from_numpy(parts.dmin)
    v = t * dx[:, None, :]
    y = torch.zeros(v.shape[:2])
    for b in range(blocks):   # the kernel's order: from +0, one block after another
        y = y + v[..., b]
    return y


def dequantize(parts: QuantParts, qtype: int) -> torch.Tensor:
    """The weight's exact values, float64 [out, in]: ``d * sc * (q - offset) - dmin * m``
    (gguf.quants.dequantize rounds the same to float32)."""
    fmt = FORMATS[qtype]
    out, width = parts.q.shape
    per = fmt.block // fmt.sub
    q = _values(parts.q, fmt).reshape(out, -1, fmt.sub) - fmt.offset
    d = torch.from_numpy(np.repeat(parts.d.astype(np.float64), per, axis=1))[..., None]
    w = d * torch.from_numpy(parts.sc.astype(np.float64))[..., None] * q
    if parts.m is not None and parts.dmin is not None:
        dmin = torch.from_numpy(np.repeat(parts.dmin.astype(np.float64), per, axis=1))
        w = w - (dmin * torch.from_numpy(parts.m.astype(np.float64)))[..., None]
    return w.reshape(out, width)
