"""GGUF quantized blocks: their integer parts, the kernel's repacked layout, and a reference
product in PyTorch that does the kernel's arithmetic bit for bit.

Every supported type writes a weight as ``w = d * sc * (q - offset) - dmin * m`` over
sub-blocks of ``sub`` inputs, with ``q`` an unsigned integer of 4, 6 or 8 bits, ``sc`` and
``m`` small integers per sub-block and ``d``, ``dmin`` float16 per block of ``block`` inputs:

====  =====  ===  ======  ==========================  ====================
type  block  sub  offset  sc, m per sub-block         d, dmin per block
====  =====  ===  ======  ==========================  ====================
Q4_0     32   32       8  1, none                     d
Q4_1     32   32       0  1, 1                        d, -min
Q5_0     32   32      16  1, none                     d
Q8_0     32   32     128  1, none                     d (q = stored int8 + 128)
Q4_K    256   32       0  6-bit, 6-bit                d, dmin
Q6_K    256   16      32  int8, none                  d
====  =====  ===  ======  ==========================  ====================

The kernel multiplies these exact values: in real arithmetic, ``w`` above is the value
``gguf.quants.dequantize`` rounds to float32 (it rounds ``d * sc * q - dmin * m`` once more).

Layout the kernel reads (``pack``): outputs in groups of 16 (padded with zero rows), and for
each group and block one record of bytes, in this order:

- the quants: for each 8 inputs, 64 bytes, 4 per output; byte ``b`` of output ``l`` holds
  input ``b`` in its low nibble and input ``4 + b`` in its high nibble (Q8_0: for each 4
  inputs, 64 bytes, byte ``b`` of output ``l`` is input ``b``);
- Q6_K only: the quants' two high bits, for each 16 inputs 64 bytes; bits ``2k, 2k+1`` of byte
  ``b`` of output ``l`` belong to input ``4k + b``;
- Q5_0 only: the quants' fifth bits, for each 32 inputs 64 bytes; bit ``k`` of byte ``b`` of
  output ``l`` belongs to input ``4k + b``;
- K-types only: ``sc`` as bytes [sub-block][16 outputs]; Q4_K's ``m`` as byte pairs
  [sub-block pair][16 outputs][2];
- ``d`` as float16 [16 outputs], then ``dmin`` where the type has one.

Bits per weight: Q4_0 4.5, Q4_1 5.0, Q5_0 5.5, Q8_0 8.5, Q4_K 4.625 (GGUF: 4.5; the 6-bit
scales take a byte each), Q6_K 6.5625 (as GGUF).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# gguf.GGMLQuantizationType values (gguf is imported only where files are read)
Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 2, 3, 6, 8, 12, 14
LANES = 16  # outputs per group: one AVX-512 register of int32


@dataclass(frozen=True)
class QuantFormat:
    """How one GGUF type's blocks are laid out and what the kernel does with them."""

    name: str
    block: int         # inputs per GGUF block (and per activation scale)
    type_size: int     # bytes per GGUF block
    sub: int           # inputs per sub-block scale
    offset: int        # subtracted from the unsigned quants
    has_min: bool      # whether a dmin * m term is subtracted
    bits: int          # 4, 5, 6 or 8

    @property
    def record_bytes(self) -> int:
        """Bytes of one packed record: 16 outputs x ``block`` inputs."""
        quants = self.block * LANES * (8 if self.bits == 8 else 4) // 8
        high = self.block * LANES * (self.bits - 4) // 8 if self.bits in (5, 6) else 0
        subs = self.block // self.sub
        scales = subs * LANES * (2 if self.has_min else 1) if self.block > 32 else 0
        return quants + high + scales + LANES * 2 * (2 if self.has_min else 1)


FORMATS = {
    Q4_0: QuantFormat("Q4_0", 32, 18, 32, 8, False, 4),
    Q4_1: QuantFormat("Q4_1", 32, 20, 32, 0, True, 4),
    Q5_0: QuantFormat("Q5_0", 32, 22, 32, 16, False, 5),
    Q8_0: QuantFormat("Q8_0", 32, 34, 32, 128, False, 8),
    Q4_K: QuantFormat("Q4_K", 256, 144, 32, 0, True, 4),
    Q6_K: QuantFormat("Q6_K", 256, 210, 16, 32, False, 6),
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


def parse(raw: np.ndarray, qtype: int) -> QuantParts:
    """GGUF rows, uint8 [out, row_bytes] -> their integer parts (see ``QuantParts``)."""
    fmt = FORMATS[qtype]
    out = raw.shape[0]
    blocks = raw.reshape(out, -1, fmt.type_size)
    ones = np.ones((out, blocks.shape[1]), np.int64)
    if qtype in (Q4_0, Q4_1):
        head = 4 if qtype == Q4_1 else 2
        q = _nibbles(blocks[..., head:], 16).reshape(out, -1)
        dmin = -_f16(blocks[..., 2:4]) if qtype == Q4_1 else None
        return QuantParts(q, ones, ones if qtype == Q4_1 else None,
                          _f16(blocks[..., 0:2]), dmin)
    if qtype == Q5_0:  # d[2] qh[4] qs[16]: weight j's fifth bit is bit j of qh
        qh = blocks[..., 2:6].copy().view("<u4")                      # [out, n, 1]
        high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        q = _nibbles(blocks[..., 6:22], 16) | (high << 4)
        return QuantParts(q.reshape(out, -1), ones, None, _f16(blocks[..., 0:2]), None)
    if qtype == Q8_0:
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return QuantParts(q.reshape(out, -1), ones, None,
                          _f16(blocks[..., 0:2]), None)
    if qtype == Q4_K:
        sc, mn = _k_scales(blocks[..., 4:16])
        q = _nibbles(blocks[..., 16:], 32).reshape(out, -1)
        return QuantParts(q, sc.reshape(out, -1).astype(np.int64),
                          mn.reshape(out, -1).astype(np.int64),
                          _f16(blocks[..., 0:2]),
                          _f16(blocks[..., 2:4]))
    # Q6_K: ql[128] qh[64] scales[16] d[2]; each half of 128 inputs takes 64 ql, 32 qh bytes
    ql = _nibbles(blocks[..., 0:128], 64)                      # [out, n, 256]
    qh = blocks[..., 128:192].reshape(out, -1, 2, 1, 32) >> np.array(
        [0, 2, 4, 6], np.uint8).reshape(4, 1)
    q = ql | ((qh & 3).reshape(out, -1, 256) << 4)
    sc = blocks[..., 192:208].view(np.int8).astype(np.int64)
    return QuantParts(q.reshape(out, -1), sc.reshape(out, -1), None,
                      _f16(blocks[..., 208:210]), None)


def _lanes(a: np.ndarray, groups: int, blocks: int) -> np.ndarray:
    """[out_padded, blocks * k] -> [groups, blocks, k, 16]: per record, output-minor."""
    return a.reshape(groups, LANES, blocks, -1).transpose(0, 2, 3, 1)


def pack(parts: QuantParts, qtype: int) -> torch.Tensor:
    """Integer parts -> the kernel's records, uint8 [groups, blocks, record_bytes]."""
    fmt = FORMATS[qtype]
    out, width = parts.q.shape
    padded = -(-out // LANES) * LANES

    def pad(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a, np.zeros((padded - out, *a.shape[1:]), a.dtype)])

    groups, blocks = padded // LANES, width // fmt.block
    q = pad(parts.q).reshape(groups, LANES, blocks, fmt.block)
    pieces = []
    if fmt.bits == 8:   # [g, l, n, block/4, 4] -> [g, n, block/4, l, 4]
        pieces.append(q.reshape(groups, LANES, blocks, -1, 4).transpose(0, 2, 3, 1, 4))
    else:
        low = q & 15
        eight = low.reshape(groups, LANES, blocks, -1, 2, 4)
        pieces.append((eight[..., 0, :] | (eight[..., 1, :] << 4)).transpose(0, 2, 3, 1, 4))
    if fmt.bits == 5:   # bit k of byte b: input 4k + b
        high = (q >> 4).reshape(groups, LANES, blocks, 8, 4)
        bits = np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8).reshape(8, 1), axis=3)
        pieces.append(bits.transpose(0, 2, 1, 3))
    if fmt.bits == 6:
        high = (q >> 4).reshape(groups, LANES, blocks, -1, 4, 4)   # [.., 16ths, k, b]
        bits = high[..., 0, :] | (high[..., 1, :] << 2) | (high[..., 2, :] << 4) | (
            high[..., 3, :] << 6)
        pieces.append(bits.transpose(0, 2, 3, 1, 4))
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

    if fmt.bits == 8:
        q = rows(take(fmt.block * LANES), 4)
    else:
        eight = take(fmt.block * LANES // 2).reshape(groups, blocks, -1, LANES, 1, 4)
        q = rows((eight >> np.array([0, 4], np.uint8).reshape(2, 1)) & 15, 2, 4)
    if fmt.bits == 5:
        high = take(fmt.block * LANES // 8).reshape(groups, blocks, 1, LANES, 1, 4)
        q = q | (rows((high >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1, 8, 4) << 4)
    if fmt.bits == 6:
        high = take(fmt.block * LANES // 4).reshape(groups, blocks, -1, LANES, 1, 4)
        shifts = (2 * np.arange(4, dtype=np.uint8)).reshape(4, 1)
        q = q | (rows((high >> shifts) & 3, 4, 4) << 4)
    subs = fmt.block // fmt.sub
    ones = np.ones((groups * LANES, blocks), np.int64)
    sc, m = ones, (ones if fmt.has_min else None)
    if fmt.block > 32:
        raw_sc = take(subs * LANES)
        sc = rows(raw_sc.view(np.int8) if qtype == Q6_K else raw_sc, 1).astype(np.int64)
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
    q = torch.from_numpy(parts.q).to(torch.float64).reshape(out, blocks, subs, fmt.sub)
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
    q = torch.from_numpy(parts.q.astype(np.float64)).reshape(out, -1, fmt.sub) - fmt.offset
    d = torch.from_numpy(np.repeat(parts.d.astype(np.float64), per, axis=1))[..., None]
    w = d * torch.from_numpy(parts.sc.astype(np.float64))[..., None] * q
    if parts.m is not None and parts.dmin is not None:
        dmin = torch.from_numpy(np.repeat(parts.dmin.astype(np.float64), per, axis=1))
        w = w - (dmin * torch.from_numpy(parts.m.astype(np.float64)))[..., None]
    return w.reshape(out, width)
