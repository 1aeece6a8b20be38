// The kernels of quant_linear.cpp for blocks of 256 inputs: k32 (sub-blocks of 32: Q4_K,
// Q5_K, IQ4_XS) and k16 (sub-blocks of 16: Q6_K, Q3_K, Q2_K), with the bit-plane helpers that
// small (blocks of 32) shares. Included by quant_linear.cpp inside its anonymous namespace,
// after quant_isa.h, kGroup, Rows, prefetch_lines, bcast and finish. dot_pair serves small too.
#pragma once

// Q5_0's and Q5_K's fifth bits: bit k of each byte of h, moved to bit 4 (the bytes' other
// bits cleared). Shifts of 16-bit lanes by at most 4 keep bit 4 of each byte within its byte.
inline I fifth_bit(I h, int k) {
  const I bit = V::set8(0x10);
  return V::and_(k <= 4 ? V::sll_n(h, 4 - k) : V::srl_n(h, k - 4), bit);
}

// Where the parts of a record of 256 inputs in sub-blocks of 32 lie (quant_formats.pack):
// Q4_K, Q5_K (a plane of fifth bits after the nibbles) and IQ4_XS (nibbles index kLevels;
// int8 scales; no mins).
template <int QT>
struct K32 {
  static constexpr bool kFive = QT == kQ5_K, kCode = QT == kIQ4_XS, kMin = !kCode;
  static constexpr int64_t kScales = 2048 + (kFive ? 512 : 0);
  static constexpr int64_t kMins = kScales + 128;
  static constexpr int64_t kD = kMins + (kMin ? 128 : 0);
  static constexpr int64_t kRecord = kD + (kMin ? 64 : 32);
};

// The min sums of `P` sub-block pairs: m * sum(x) over the sub-blocks, by int16 pairs.
template <int R, int P>
inline void min_sums(const uint8_t* mins, const Rows& a, int lane0, I* msum) {
  I pairs[P];
  for (int p = 0; p < P; ++p) pairs[p] = V::u8x16(mins + 32 * p + 2 * lane0);
  for (int r = 0; r < R; ++r) {
    msum[r] = V::zero();
    for (int p = 0; p < P; ++p)
      msum[r] = V::dot16(msum[r], pairs[p], V::set1(load32(a.xs + r * a.ldxs + 2 * p)));
  }
}

// even += lo * xe and odd += hi * xo, through Q8_0's product where the quants are looked-up
// levels (kCode: offset 128 on AVX-512).
template <bool kCode>
inline void dot_pair(I& even, I& odd, I lo, I hi, I xe, I xo) {
  if constexpr (kCode) {
    even = V::dot_q8(even, lo, xe);
    odd = V::dot_q8(odd, hi, xo);
  } else {
    even = V::dot(even, lo, xe);
    odd = V::dot(odd, hi, xo);
  }
}

// End of a sub-block: each group's S partial sums per row, added up and times the group's
// sub-block scales sc[q], go into its block sums isum.
template <int G, int R, int S>
inline void add_scaled(I (&isum)[G][R], I (&part)[G][R][S], const I (&sc)[G]) {
  for (int q = 0; q < G; ++q)
    for (int r = 0; r < R; ++r) {
      for (int s = 1; s < S; ++s) part[q][r][0] = V::add(part[q][r][0], part[q][r][s]);
      isum[q][r] = V::add(isum[q][r], V::mul(part[q][r][0], sc[q]));
    }
}

// End of a block of 256 inputs: each group's outputs from its sums, the record's d (and, with
// mins, dmin and the min sums of P sub-block pairs). kD, kMins: where they lie in a record.
template <int G, int R, bool kMin, int P>
inline void finish_groups(const uint8_t* rec, int64_t kD, int64_t kMins, I (&isum)[G][R],
                          const Rows& a, int lane0, bool first) {
  for (int q = 0; q < G; ++q) {
    const uint8_t* at = rec + q * a.next;
    Rows out = a;
    out.y += q * kGroup;
    const F d = V::half(at + kD + 2 * lane0);
    if constexpr (kMin) {
      I msum[R];
      min_sums<R, P>(at + kMins, a, lane0, msum);
      finish<R, true>(isum[q], msum, d, V::half(at + kD + 32 + 2 * lane0), out, 0, first);
    } else {
      finish<R, false>(isum[q], isum[q], d, V::setf(0.f), out, 0, first);
    }
  }
}

// One block of 256 inputs in 8 sub-blocks of 32 (K32's types), for G groups of 16 outputs
// (G records a.next bytes apart; their outputs kGroup floats apart): each activation
// broadcast feeds all G (quant_linear.cpp, kPairRows32's note). lane0: first output of this
// call within the record (AVX2 takes the 16 outputs in two halves).
template <int R, int QT, int G = 1>
void k32(const uint8_t* rec, int64_t /*count*/, const Rows& a, const uint8_t* ahead, int lane0,
         bool first) {
  using L = K32<QT>;
  // Independent sums per row: vpdpbusd's latency is 4 cycles, its throughput 1 a cycle, so
  // one or two rows keep several chains in flight (integers: their order changes nothing).
  constexpr int S = R * G >= 4 ? 1 : 4 / (R * G);
  constexpr int32_t kOffset = L::kCode && V::kQ8Offset ? 128 : 0;
  const I low = V::set8(0x0F);
  const I levels = L::kCode ? V::table(kLevels) : V::zero();
  I isum[G][R], acc[G][R][S];
  for (int q = 0; q < G; ++q)
    for (int r = 0; r < R; ++r) isum[q][r] = V::zero();
  for (int j = 0; j < 8; ++j) {
    for (int q = 0; q < G; ++q)
      prefetch_lines(ahead == nullptr ? nullptr : ahead + q * a.next, j * L::kRecord / 8,
                     (j + 1) * L::kRecord / 8, a);
    for (int q = 0; q < G; ++q)
      for (int r = 0; r < R; ++r) {
        acc[q][r][0] = V::set1(-kOffset * a.xs[r * a.ldxs + j]);
        for (int s = 1; s < S; ++s) acc[q][r][s] = V::zero();
      }
    for (int c = 0; c < 4; ++c) {
      I lo[G], hi[G];
      for (int q = 0; q < G; ++q) {
        const uint8_t* at = rec + q * a.next;
        const I p = V::load(at + (4 * j + c) * 64 + lane0 * 4);
        lo[q] = V::and_(p, low);
        hi[q] = V::and_(V::srl<4>(p), low);
        if constexpr (L::kFive) {   // inputs 8c + b and 8c + 4 + b: bits 2c and 2c + 1
          const I h = V::load(at + 2048 + 64 * j + lane0 * 4);
          lo[q] = V::or_(lo[q], fifth_bit(h, 2 * c));
          hi[q] = V::or_(hi[q], fifth_bit(h, 2 * c + 1));
        }
        if constexpr (L::kCode) {
          lo[q] = V::lookup(levels, lo[q]);
          hi[q] = V::lookup(levels, hi[q]);
        }
      }
      const int8_t* x = a.xq + 32 * j + 8 * c;
      for (int r = 0; r < R; ++r) {
        const I xe = bcast(x + r * a.ldx), xo = bcast(x + r * a.ldx + 4);
        for (int q = 0; q < G; ++q)
          dot_pair<L::kCode>(acc[q][r][(2 * c) % S], acc[q][r][(2 * c + 1) % S], lo[q], hi[q],
                             xe, xo);
      }
    }
    I sc[G];
    for (int q = 0; q < G; ++q) {
      const uint8_t* scales = rec + q * a.next + L::kScales + 16 * j + lane0;
      sc[q] = L::kCode ? V::i8x32(scales) : V::u8x32(scales);
    }
    add_scaled(isum, acc, sc);
  }
  finish_groups<G, R, L::kMin, 4>(rec, L::kD, L::kMins, isum, a, lane0, first);
}

// Q3_K's third bits: bit i of each byte of h, moved to bit 2 (the bytes' other bits cleared);
// shifts of 16-bit lanes by at most 5 keep bit 2 of each byte within its byte.
inline I third_bit(I h, int i) {
  const I bit = V::set8(0x04);
  return V::and_(i <= 2 ? V::sll_n(h, 2 - i) : V::srl_n(h, i - 2), bit);
}

// Where the parts of a record of 256 inputs in sub-blocks of 16 lie: Q6_K (nibbles, then a
// plane of two high bits; quants 0..63, less 32), Q3_K (a plane of two low bits, then one of
// third bits; quants 0..7, less 4) and Q2_K (two bits, with mins); int8 scales (Q2_K's 0..15).
template <int QT>
struct K16 {
  static constexpr bool kHigh = QT == kQ6_K, kThird = QT == kQ3_K, kMin = QT == kQ2_K;
  static constexpr int32_t kOffset = QT == kQ6_K ? 32 : (QT == kQ3_K ? 4 : 0);
  static constexpr int64_t kScales = kHigh ? 3072 : (kThird ? 1536 : 1024);
  static constexpr int64_t kMins = kScales + 256;
  static constexpr int64_t kD = kMins + (kMin ? 256 : 0);
  static constexpr int64_t kRecord = kD + (kMin ? 64 : 32);
};

// Sub-block j's 16 quants of each of a record's 16 outputs (K16's types), as 4 registers:
// q[k] holds inputs 4k .. 4k + 3 of every output, as unsigned bytes.
template <int QT>
inline void k16_quants(const uint8_t* rec, int j, int lane0, I* q) {
  using L = K16<QT>;
  const I low = V::set8(0x0F), high = V::set8(0x30), three = V::set8(0x03);
  if constexpr (L::kHigh) {
    const I p0 = V::load(rec + 128 * j + lane0 * 4), p1 = V::load(rec + 128 * j + 64 + lane0 * 4);
    const I h = V::load(rec + 2048 + 64 * j + lane0 * 4);
    q[0] = V::or_(V::and_(p0, low), V::and_(V::sll<4>(h), high));
    q[1] = V::or_(V::and_(V::srl<4>(p0), low), V::and_(V::sll<2>(h), high));
    q[2] = V::or_(V::and_(p1, low), V::and_(h, high));
    q[3] = V::or_(V::and_(V::srl<4>(p1), low), V::and_(V::srl<2>(h), high));
  } else {   // bits 2k, 2k + 1 of byte b: input 4k + b
    const I p = V::load(rec + 64 * j + lane0 * 4);
    q[0] = V::and_(p, three);
    q[1] = V::and_(V::srl<2>(p), three);
    q[2] = V::and_(V::srl<4>(p), three);
    q[3] = V::and_(V::srl<6>(p), three);
  }
  if constexpr (L::kThird) {   // for each 32 inputs, bit i of byte b: input 4i + b
    const I h = V::load(rec + 1024 + 64 * (j / 2) + lane0 * 4);
    for (int k = 0; k < 4; ++k) q[k] = V::or_(q[k], third_bit(h, 4 * (j % 2) + k));
  }
}

// One block of 256 inputs in 16 sub-blocks of 16 (K16's types), for G groups as k32.
template <int R, int QT, int G = 1>
void k16(const uint8_t* rec, int64_t /*count*/, const Rows& a, const uint8_t* ahead, int lane0,
         bool first) {
  using L = K16<QT>;
  constexpr int S = R * G >= 4 ? 1 : 4 / (R * G);   // independent sums per row, as in k32
  I isum[G][R], two[G][R][S];
  for (int q = 0; q < G; ++q)
    for (int r = 0; r < R; ++r) isum[q][r] = V::zero();
  for (int j = 0; j < 16; ++j) {
    for (int q = 0; q < G; ++q)
      prefetch_lines(ahead == nullptr ? nullptr : ahead + q * a.next, j * L::kRecord / 16,
                     (j + 1) * L::kRecord / 16, a);
    for (int q = 0; q < G; ++q)
      for (int r = 0; r < R; ++r) {
        two[q][r][0] = V::set1(-L::kOffset * a.xs[r * a.ldxs + j]);
        for (int s = 1; s < S; ++s) two[q][r][s] = V::zero();
      }
    I quants[G][4];
    for (int q = 0; q < G; ++q) k16_quants<QT>(rec + q * a.next, j, lane0, quants[q]);
    const int8_t* x = a.xq + 16 * j;
    for (int k = 0; k < 4; ++k)
      for (int r = 0; r < R; ++r) {
        const I xk = bcast(x + r * a.ldx + 4 * k);
        for (int q = 0; q < G; ++q)
          two[q][r][k % S] = V::dot(two[q][r][k % S], quants[q][k], xk);
      }
    I sc[G];
    for (int q = 0; q < G; ++q) sc[q] = V::i8x32(rec + q * a.next + L::kScales + 16 * j + lane0);
    add_scaled(isum, two, sc);
  }
  finish_groups<G, R, L::kMin, 8>(rec, L::kD, L::kMins, isum, a, lane0, first);
}
