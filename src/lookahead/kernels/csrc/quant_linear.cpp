// y = x @ W.T + b for a weight W kept in GGUF's quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) and a few rows x, by integer dot products:
// each weight is read from memory once per pass and multiplied into up to kRows token rows.
//
// Why our own: decoding a 1.5B model on a CPU is bound by reading its weights (Q4_K_M: 1.04
// GiB, about 31 ms a pass at 33 GB/s), and speculation pays only when checking k guessed
// tokens costs about as much as one. PyTorch's CPU products, one 8960 x 1536 layer, one
// thread, on a 2-core AMD EPYC (Zen 4), cost for 1 / 2 / 4 / 8 rows (docs/quantized-kernel.md):
// - FBGEMM's dynamic int8: 1.0 / 1.04 / 1.33 / 2.28 times one row, fast, but int8 weights
//   with one scale per output: 8 bits a weight (twice Q4_K's bytes per token), and Q4_K's
//   per-32 scales and mins or Q6_K's per-16 scales cannot go in without re-quantizing;
// - _weight_int8pack_mm: 1.0 / 1.30 / 1.78 / 3.56, 8 bits a weight, one scale per output;
// - _weight_int4pack_mm_for_cpu: 1.0 / 1.20 / 1.64 / 3.16, 4-bit groups with a bfloat16
//   scale and zero, which hold neither Q4_K's d * sc and dmin * m exactly nor Q6_K's 6 bits;
// - bfloat16 F.linear: 3.5 times Q4_K's bytes, bound by arithmetic without AMX.
// None takes a Q4_K_M file's blocks losslessly at their size.
//
// How: the activations are quantized per row to int8 with one scale per GGUF block (256
// inputs for the K-types, as ggml's q8_K; 32 for the others, as q8_0). For 16 outputs at a
// time (one 512-bit register of int32), each 64-byte chunk of packed quants is loaded and
// unpacked once and multiplied into every row with vpdpbusd (AVX512-VNNI: unsigned weight
// bytes times signed activation bytes, 4 products a lane) or, on AVX2, with vpmaddubsw and
// vpmaddwd. Sub-block scales multiply the integer sums exactly (int32); per block one float
// combination ((isum * d) - (msum * dmin)) * dx is added to the row's float32 sum. The integer
// sums are exact, and the float operations run in one fixed order per row, so
// (a) lookahead.kernels.quant_formats.reference_linear gives the same bits in PyTorch, and
// (b) a row's result does not depend on the rows beside it: k rows give the bits of k passes
//     of one row.
// The layout (quant_formats.py's docstring) keeps about the GGUF sizes: Q4_K 4.625 bits a
// weight (its 6-bit scales widened to bytes), Q5_K 5.625, Q6_K 6.5625, Q3_K 3.5625, Q2_K
// 3.125, IQ4_XS 4.3125, Q4_0 and IQ4_NL 4.5, Q4_1 5, Q5_0 5.5, Q5_1 6, Q8_0 8.5. IQ4's
// 4-bit indices become their levels by one byte shuffle (vpshufb) per 64 bytes.
//
// Built twice by quant_linear.py: with -mavx512vnni (and BW, VL, F16C) or with -mavx2 and
// F16C; the same templates serve both through the traits struct V, defined per build in
// quant_isa.h (the kernels for blocks of 256 inputs are in quant_blocks.h).
#include "aten_light.h"  // not <torch/extension.h>: why in aten_light.h
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

namespace {

enum QType : int {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12,
  kQ5_K = 13, kQ6_K = 14, kIQ4_NL = 20, kIQ4_XS = 23
};
// IQ4_NL's and IQ4_XS's 16 levels (ggml's kvalues_iq4nl) plus 128, as unsigned bytes: a
// looked-up quant then goes through the Q8_0 product (dot_q8), offset 128 included.
alignas(16) constexpr uint8_t kLevels[16] = {1, 24, 45, 63, 79, 93, 106, 118,
                                             129, 141, 153, 166, 181, 197, 217, 241};
constexpr int kGroup = 16;          // outputs per record
// Bytes of records ahead to ask memory for. Without it, a pass of 8 rows over a Q4_K layer
// read from memory took 1.8 times its time from cache (memory and arithmetic did not
// overlap); with it, the same. Where one tile takes all the rows (decoding), each record is
// read once a pass, and the caller says how to ask for it (``nontemporal``): on an AMD EPYC
// (Zen 4), fetched as usual, a gigabyte of them pushed everything else out of the caches
// (the attention's keys, the Python between the layers), which then ran several times
// slower, so there they are asked for as non-temporal (prefetchnta); on an Intel Xeon
// (Emerald Rapids), prefetchnta left the records out of L2 and a one-token pass of
// Qwen2.5-Coder-1.5B Q4_K_M took 64 ms against 47 ms with prefetcht0, so there they are
// fetched as usual. Where later tiles read them again (a prompt), they are fetched as usual
// everywhere (docs/quantized-kernel.md).
constexpr int64_t kAhead = 4096;
// Where the lines asked for kAhead bytes on go to L1 (prefetcht0), the loads wait on them in
// L1's few fill buffers. Asking for them to L2 (prefetcht1) that far ahead and to L1 only
// `near` bytes ahead, on an Intel Xeon (family 6, model 167; 2026-12-07, 2 threads), read the
// 196 linears of Qwen2.5-Coder-1.5B Q4_K_M for 1 / 2 / 4 rows in 33.9 / 36.3 / 42.0 ms at
// 4096 and 512 bytes, against 37.8 / 44.8 / 47.3 ms with prefetcht0 alone at its fastest,
// 2048 (docs/quantized-kernel.md). 0: L1 alone (lookahead.kernels.prefetch measures which).
constexpr int64_t kNear = 0;

inline int32_t load32(const void* p) { int32_t v; std::memcpy(&v, p, 4); return v; }

#include "quant_isa.h"   // struct V: the build's instructions; kRows, kTile

// Where one call's rows are: xq at the block's first input of row 0, dx / xs at its first
// scale / sub-sum, y at the group's first output of row 0; ld* step one row on. once: ask
// for the records as non-temporal, where no later tile of rows reads them again and the
// caller asked for it (kAhead's note).
struct Rows {
  const int8_t* xq; int64_t ldx;
  const float* dx; int64_t lddx;
  const int16_t* xs; int64_t ldxs;
  float* y; int64_t ldy;
  bool once = true;
  int64_t back = 0;  // > 0: far lines to L2, and lines `back` bytes nearer to L1 (kNear's note)
  int64_t next = 0;  // bytes from one group's record to the next group's (kernels of G groups)
};

inline I bcast(const int8_t* p) { return V::set1(load32(p)); }

// Asks for the lines of [ahead + from, ahead + to) (nothing when ahead is null): as
// non-temporal (a.once), to L2 and again a.back bytes nearer to L1 (a.back > 0), or to L1
// (kAhead's and kNear's notes). An asm statement: GCC 12 dropped _mm_prefetch here as dead
// code (no prefetch instruction in the build).
inline void prefetch_lines(const uint8_t* ahead, int64_t from, int64_t to, const Rows& a) {
  if (ahead == nullptr) return;
  if (a.once) {
    for (int64_t o = from; o < to; o += 64) asm volatile("prefetchnta %0" : : "m"(ahead[o]));
  } else if (a.back > 0) {
    for (int64_t o = from; o < to; o += 64) {
      asm volatile("prefetcht1 %0" : : "m"(ahead[o]));
      asm volatile("prefetcht0 %0" : : "m"(ahead[o - a.back]));
    }
  } else {
    for (int64_t o = from; o < to; o += 64) asm volatile("prefetcht0 %0" : : "m"(ahead[o]));
  }
}

// y[r] += ((isum * d) - (msum * dmin)) * dx[r], in this order (reference_linear's); the first
// block adds to +0 rather than to y (not yet written).
template <int R, bool kMin>
inline void finish(const I* isum, const I* msum, F d, F dmin, const Rows& a, int64_t b,
                   bool first) {
  for (int r = 0; r < R; ++r) {
    F t = V::fmul(V::cvt(isum[r]), d);
    if constexpr (kMin) t = V::fsub(t, V::fmul(V::cvt(msum[r]), dmin));
    t = V::fmul(t, V::setf(a.dx[r * a.lddx + b]));
    float* y = a.y + r * a.ldy;
    V::storef(y, V::fadd(first ? V::setf(0.f) : V::loadf(y), t));
  }
}

#include "quant_blocks.h"   // k32, k16: blocks of 256 inputs

// Chunk c of a record of blocks of 32 with 4-bit quants (small's types but Q8_0) as unsigned
// bytes: lo holds inputs 8c + b of each output, hi inputs 8c + 4 + b.
template <int QT>
inline void small_quants(const uint8_t* rec, int c, int lane0, I low, I levels, I& lo, I& hi) {
  const I p = V::load(rec + 64 * c + lane0 * 4);
  lo = V::and_(p, low);
  hi = V::and_(V::srl<4>(p), low);
  if constexpr (QT == kQ5_0 || QT == kQ5_1) {   // bits 2c and 2c + 1 of the plane
    const I h = V::load(rec + 256 + lane0 * 4);
    lo = V::or_(lo, fifth_bit(h, 2 * c));
    hi = V::or_(hi, fifth_bit(h, 2 * c + 1));
  }
  if constexpr (QT == kIQ4_NL) {
    lo = V::lookup(levels, lo);
    hi = V::lookup(levels, hi);
  }
}

// `count` blocks of 32 inputs (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), one float16 scale (and
// min) each, for G groups of 16 outputs as k32 (quant_blocks.h).
template <int R, int QT, int G = 1>
void small(const uint8_t* rec, int64_t count, const Rows& a, const uint8_t* ahead, int lane0,
           bool first) {
  constexpr bool kByte = QT == kQ8_0, kFive = QT == kQ5_0 || QT == kQ5_1;
  constexpr bool kMin = QT == kQ4_1 || QT == kQ5_1, kCode = QT == kIQ4_NL;
  constexpr int64_t kQuantBytes = kByte ? 512 : (kFive ? 256 + 64 : 256);  // Q5: + bits
  constexpr int64_t kBytes = kQuantBytes + (kMin ? 64 : 32);
  constexpr int32_t kOffset = QT == kQ4_0 ? 8 : (QT == kQ5_0 ? 16 :
                              ((kByte || kCode) && V::kQ8Offset ? 128 : 0));
  constexpr int S = R * G >= 4 ? 1 : 4 / (R * G);   // independent sums per row, as in k32
  const I low = V::set8(0x0F);
  const I levels = kCode ? V::table(kLevels) : V::zero();
  I acc[G][R][S], msum[R];
  for (int64_t b = 0; b < count; ++b, rec += kBytes) {
    for (int q = 0; q < G; ++q)
      prefetch_lines(ahead == nullptr ? nullptr : ahead + q * a.next + b * kBytes, 0, kBytes, a);
    for (int r = 0; r < R; ++r) {
      const int32_t xs = a.xs[r * a.ldxs + b];
      for (int q = 0; q < G; ++q) {
        acc[q][r][0] = V::set1(-kOffset * xs);
        for (int s = 1; s < S; ++s) acc[q][r][s] = V::zero();
      }
      msum[r] = V::set1(xs);
    }
    const int8_t* x = a.xq + 32 * b;
    for (int c = 0; c < (kByte ? 8 : 4); ++c) {
      if constexpr (kByte) {
        I p[G];
        for (int q = 0; q < G; ++q) p[q] = V::load(rec + q * a.next + 64 * c + lane0 * 4);
        for (int r = 0; r < R; ++r) {
          const I xc = bcast(x + r * a.ldx + 4 * c);
          for (int q = 0; q < G; ++q) acc[q][r][c % S] = V::dot_q8(acc[q][r][c % S], p[q], xc);
        }
      } else {
        I lo[G], hi[G];
        for (int q = 0; q < G; ++q)
          small_quants<QT>(rec + q * a.next, c, lane0, low, levels, lo[q], hi[q]);
        for (int r = 0; r < R; ++r) {
          const I xe = bcast(x + r * a.ldx + 8 * c), xo = bcast(x + r * a.ldx + 8 * c + 4);
          for (int q = 0; q < G; ++q)
            dot_pair<kCode>(acc[q][r][(2 * c) % S], acc[q][r][(2 * c + 1) % S], lo[q], hi[q],
                            xe, xo);
        }
      }
    }
    for (int q = 0; q < G; ++q) {
      I isum[R];
      for (int r = 0; r < R; ++r) {
        isum[r] = acc[q][r][0];
        for (int s = 1; s < S; ++s) isum[r] = V::add(isum[r], acc[q][r][s]);
      }
      const uint8_t* at = rec + q * a.next;
      Rows out = a;
      out.y += q * kGroup;
      const F d = V::half(at + kQuantBytes + 2 * lane0);
      if constexpr (kMin) {
        finish<R, true>(isum, msum, d, V::half(at + kQuantBytes + 32 + 2 * lane0), out, b,
                        first && b == 0);
      } else {
        finish<R, false>(isum, msum, d, d, out, b, first && b == 0);
      }
    }
  }
}

using Kernel = void (*)(const uint8_t*, int64_t, const Rows&, const uint8_t*, int, bool);

// Rows up to which two groups of 16 outputs go through one call, so that each activation
// broadcast (a load) and each loop's bookkeeping serve two records. On an Intel Xeon (family
// 6, model 167; 2026-12-07, 2 threads) the 196 linears of Qwen2.5-Coder-1.5B Q4_K_M took
// 48.4 / 50.9 / 53.8 ms for 2 / 3 / 4 rows against 51.0 / 55.9 / 57.4 ms one group a call
// (medians of six alternating runs of benchmarks/forward_cost.py --times quant; one row 46.3
// against 47.5). At 8 rows two groups' sums leave too few of the 32 registers. Q6_K's groups
// keep four registers of quants each, hence fewer rows; AVX2's 16 registers hold no second
// group.
constexpr int kPairRows32 = V::kLanes == 16 ? 6 : 0;
constexpr int kPairRows16 = V::kLanes == 16 ? 4 : 0;

template <int QT, int R, int G>
constexpr Kernel kernel_for() {
  constexpr bool k32_type = QT == kQ4_K || QT == kQ5_K || QT == kIQ4_XS;
  constexpr bool k16_type = QT == kQ6_K || QT == kQ3_K || QT == kQ2_K;
  constexpr int pair_rows = k16_type ? kPairRows16 : kPairRows32;
  if constexpr (G == 2 && R > pair_rows) return nullptr;
  else if constexpr (k32_type) return k32<R, QT, G>;
  else if constexpr (k16_type) return k16<R, QT, G>;
  else return small<R, QT, G>;
}

// kernel_for<QT, 1, G> ... <QT, kRows, G>, indexed by rows - 1 (null: no kernel of G groups
// for that many rows)
template <int QT, int G, int... R>
constexpr std::array<Kernel, sizeof...(R)> rows_table(std::integer_sequence<int, R...>) {
  return {kernel_for<QT, R + 1, G>()...};
}

struct Format { int64_t block, sub, record, step; };

Format format_of(int64_t qtype) {
  switch (qtype) {
    case kQ4_0: case kIQ4_NL: return {32, 32, 288, 8};
    case kQ4_1: return {32, 32, 320, 8};
    case kQ5_0: return {32, 32, 352, 8};
    case kQ5_1: return {32, 32, 384, 8};
    case kQ8_0: return {32, 32, 544, 8};
    case kQ4_K: return {256, 32, K32<kQ4_K>::kRecord, 1};
    case kQ5_K: return {256, 32, K32<kQ5_K>::kRecord, 1};
    case kIQ4_XS: return {256, 32, K32<kIQ4_XS>::kRecord, 1};
    case kQ2_K: return {256, 16, K16<kQ2_K>::kRecord, 1};
    case kQ3_K: return {256, 16, K16<kQ3_K>::kRecord, 1};
    case kQ6_K: return {256, 16, K16<kQ6_K>::kRecord, 1};
    default: TORCH_CHECK(false, "qtype: expected one of Q4_0 (2), Q4_1 (3), Q5_0 (6), Q5_1 (7), "
                         "Q8_0 (8), Q2_K (10), Q3_K (11), Q4_K (12), Q5_K (13), Q6_K (14), "
                         "IQ4_NL (20), IQ4_XS (23), got ", qtype);
  }
  return {};
}

// Groups [g0, g1) of 16 outputs: for each `step` blocks, every tile of up to `tile` rows reads
// them (the first tile from memory, asking for the records kAhead bytes on; later tiles from
// cache). all.once: ask for the records as non-temporal (one tile of all the rows only).
template <int QT>
void run_groups(int64_t g0, int64_t g1, const uint8_t* records, const Format& f, int64_t blocks,
                const Rows& all, int64_t n, int64_t tile, int64_t distance) {
  static constexpr auto one = rows_table<QT, 1>(std::make_integer_sequence<int, kRows>{});
  static constexpr auto two = rows_table<QT, 2>(std::make_integer_sequence<int, kRows>{});
  const int64_t subs = f.block / f.sub;
  // Two groups at a time where a kernel of two groups takes the rows (kPairRows32's note).
  const bool pairs = n <= tile && two[std::min<int64_t>(tile, n) - 1] != nullptr;
  for (int64_t g = g0; g < g1;) {
    const int width = pairs && g + 1 < g1 ? 2 : 1;
    const auto& table = width == 2 ? two : one;
    for (int64_t b = 0; b < blocks; b += f.step) {
      const uint8_t* rec = records + (g * blocks + b) * f.record;
      const int64_t count = std::min(f.step, blocks - b);
      for (int64_t r = 0; r < n; r += tile) {
        const Rows a{all.xq + r * all.ldx + b * f.block, all.ldx,
                     all.dx + r * all.lddx + b, all.lddx,
                     all.xs + r * all.ldxs + b * subs, all.ldxs,
                     all.y + r * all.ldy + g * kGroup, all.ldy, all.once, all.back,
                     blocks * f.record};
        const int64_t rows = std::min<int64_t>(tile, n - r);
        const bool ask = r == 0 && distance > 0;
        const uint8_t* ahead = ask ? rec + distance : nullptr;
        for (int lane0 = 0; lane0 < kGroup; lane0 += V::kLanes) {
          Rows half = a;
          half.y += lane0;
          table[rows - 1](rec, count, half, lane0 ? nullptr : ahead, lane0, b == 0);
        }
      }
    }
    g += width;
  }
}

// Row by row: xq = round-half-even(x * (127 / amax)) per block, dx = amax / 127, xs = sums
// of xq per sub-block (quant_formats.quantize_rows does the same in PyTorch). AVX-512: 16
// lanes at a time (vcvtps2dq rounds half to even, as nearbyint does).
void quantize_block(const float* v, int64_t block, int64_t sub, int8_t* q, float* dx,
                    int16_t* xs) {
#if defined(__AVX512F__)
  __m512 m = _mm512_setzero_ps();
  for (int64_t i = 0; i < block; i += 16)
    m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(v + i)));
  const float amax = _mm512_reduce_max_ps(m);
#else
  float amax = 0.f;
  for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(v[i]));
#endif
  const float inverse = amax > 0.f ? 127.f / amax : 0.f;
  *dx = amax / 127.f;
#if defined(__AVX512F__)
  const __m512 scale = _mm512_set1_ps(inverse);
  const __m512i top = _mm512_set1_epi32(127), bottom = _mm512_set1_epi32(-127);
  int32_t sum = 0;
  for (int64_t i = 0; i < block; i += 16) {
    __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + i), scale));
    r = _mm512_max_epi32(_mm512_min_epi32(r, top), bottom);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(r));
    sum += _mm512_reduce_add_epi32(r);
    if ((i + 16) % sub == 0) { xs[i / sub] = static_cast<int16_t>(sum); sum = 0; }
  }
#else
  for (int64_t i = 0; i < block; ++i) {
    const float s = std::nearbyint(v[i] * inverse);   // rounds half to even
    q[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, s)));
  }
  for (int64_t s = 0; s < block / sub; ++s) {
    int32_t sum = 0;
    for (int64_t i = 0; i < sub; ++i) sum += q[s * sub + i];
    xs[s] = static_cast<int16_t>(sum);
  }
#endif
}

void quantize_rows(const float* x, int64_t n, int64_t width, int64_t block, int64_t sub,
                   int8_t* xq, float* dx, int16_t* xs) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < width / block; ++b)
      quantize_block(x + r * width + b * block, block, sub, xq + r * width + b * block,
                     dx + r * (width / block) + b, xs + r * (width / sub) + b * (block / sub));
}

// y [N, O] float32 += bias [O] (float32 sums, as PyTorch's y + bias rounds them)
void add_bias(at::Tensor& y, const at::Tensor& bias) {
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == y.size(1), "bias: expected [", y.size(1),
              "], got ", bias.sizes());
  const at::Tensor b = bias.to(at::kFloat).contiguous();
  const float* pb = b.data_ptr<float>();
  float* py = y.data_ptr<float>();
  const int64_t n = y.size(0), o = y.size(1);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < o; ++j) py[r * o + j] += pb[j];
}

}  // namespace

// x [..., I] float32 or bfloat16, records uint8 [G, blocks, record] -> [..., out_features] in
// x's dtype, or the float32 sums [N, out_features] (before the bias) with float_output;
// tile: rows per weight read (0: kTile); distance: bytes of records ahead to prefetch;
// nontemporal: records read once a pass asked for as non-temporal (kAhead's note); near:
// where not 0, the bytes ahead to ask for them to L1, the far ones going to L2 (kNear's). The
// leading dimensions and the bias are handled here, not in Python: a decoding step calls this
// about 200 times, and each Python-side reshape or add cost a microsecond or two.
at::Tensor linear(const at::Tensor& x, const at::Tensor& records, int64_t qtype,
                  int64_t out_features, const c10::optional<at::Tensor>& bias,
                  bool float_output, int64_t tile, int64_t distance, bool nontemporal,
                  int64_t near) {
  const Format f = format_of(qtype);
  tile = tile == 0 ? kTile : tile;
  TORCH_CHECK(tile >= 1 && tile <= kRows, "tile: expected 1 to ", kRows, " rows, got ", tile);
  TORCH_CHECK(near >= 0 && (near == 0 || near < distance), "near: expected 0 or fewer bytes "
              "than distance (", distance, "), got ", near);
  TORCH_CHECK(x.dim() >= 1 && (!float_output || x.dim() == 2),
              "x: expected [..., in_features] ([rows, in_features] for the sums), got ",
              x.sizes());
  TORCH_CHECK(records.dim() == 3 && records.scalar_type() == at::kByte &&
              records.size(2) == f.record && records.is_contiguous(),
              "records: expected contiguous uint8 [groups, blocks, ", f.record, "]");
  const int64_t width = x.size(-1), groups = records.size(0), blocks = records.size(1);
  TORCH_CHECK(width == blocks * f.block, "x: expected [..., ", blocks * f.block, "], got ",
              x.sizes());
  const int64_t n = x.numel() / width;
  TORCH_CHECK(out_features <= groups * kGroup, "out_features: at most ", groups * kGroup);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  auto bytes = x.options().dtype(at::kChar);
  at::Tensor xq = at::empty({n, width}, bytes);
  at::Tensor dx = at::empty({n, blocks}, x.options().dtype(at::kFloat));
  at::Tensor xs = at::empty({n, width / f.sub}, x.options().dtype(at::kShort));
  quantize_rows(xf.data_ptr<float>(), n, width, f.block, f.sub, xq.data_ptr<int8_t>(),
                dx.data_ptr<float>(), xs.data_ptr<int16_t>());
  at::Tensor y = at::empty({n, groups * kGroup}, x.options().dtype(at::kFloat));
  const Rows all{xq.data_ptr<int8_t>(), width, dx.data_ptr<float>(), blocks,
                 xs.data_ptr<int16_t>(), width / f.sub, y.data_ptr<float>(), groups * kGroup,
                 n <= tile && nontemporal, near > 0 ? distance - near : 0};
  const auto* rec = records.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    switch (qtype) {
      case kQ4_0: run_groups<kQ4_0>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
      case kQ4_1: run_groups<kQ4_1>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
      case kQ5_0: run_groups<kQ5_0>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
      case kQ8_0: run_groups<kQ8_0>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
      case kQ5_1: run_groups<kQ5_1>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
      case kIQ4_NL: run_groups<kIQ4_NL>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
      case kQ2_K: run_groups<kQ2_K>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
      case kQ3_K: run_groups<kQ3_K>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
      case kQ4_K: run_groups<kQ4_K>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
      case kQ5_K: run_groups<kQ5_K>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
      case kIQ4_XS: run_groups<kIQ4_XS>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
      default: run_groups<kQ6_K>(g0, g1, rec, f, blocks, all, n, tile, distance); break;
    }
  });
  if (out_features != groups * kGroup) y = y.narrow(1, 0, out_features).contiguous();
  if (float_output) return y;
  if (bias.has_value() && bias->defined()) add_bias(y, *bias);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out_features;
  y = y.view(shape);
  return y.scalar_type() == x.scalar_type() ? y : y.to(x.scalar_type());
}

// The activations as the kernel quantizes them (for tests): x float32 [N, I] ->
// (xq int8 [N, I], dx float32 [N, I / block], xs int16 [N, I / sub])
std::vector<at::Tensor> quantize(const at::Tensor& x, int64_t block, int64_t sub) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) % block == 0 &&
              block % sub == 0, "x: expected float32 [N, I] with I a multiple of ", block);
  const at::Tensor xf = x.contiguous();
  const int64_t n = x.size(0), width = x.size(1);
  at::Tensor xq = at::empty({n, width}, x.options().dtype(at::kChar));
  at::Tensor dx = at::empty({n, width / block}, x.options());
  at::Tensor xs = at::empty({n, width / sub}, x.options().dtype(at::kShort));
  quantize_rows(xf.data_ptr<float>(), n, width, block, sub, xq.data_ptr<int8_t>(),
                dx.data_ptr<float>(), xs.data_ptr<int16_t>());
  return {xq, dx, xs};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("isa") = kIsa;
  m.attr("rows") = kRows;
  m.attr("tile") = kTile;
  m.attr("ahead") = kAhead;
  m.attr("near") = kNear;
  m.def("linear", &linear, "x @ W.T + b from GGUF blocks repacked by quant_formats.pack",
        py::arg("x"), py::arg("records"), py::arg("qtype"), py::arg("out_features"),
        py::arg("bias") = py::none(), py::arg("float_output") = false, py::arg("tile") = 0,
        py::arg("distance") = kAhead, py::arg("nontemporal") = true, py::arg("near") = kNear);
  m.def("quantize", &quantize, "the activations as linear quantizes them",
        py::arg("x"), py::arg("block"), py::arg("sub"));
}
