// Attention whose every query row is computed the same way whatever else is in the pass: how
// many rows there are, how long the cache is, where its gaps are, which rows are padding.
//
// Why our own: the guarantee "every method writes what autoregressive decoding writes" needs
// a pass of k tokens to give, row by row, the bits of k passes of one token, and a request
// among 8 in the server's batch to give the bits of the same request alone. The quantized
// linears do (csrc/quant_linear.cpp), but PyTorch's scaled_dot_product_attention does not:
// its CPU kernels block the keys and the queries by sizes that follow the shapes, so a row's
// sums are rounded in an order that depends on the number of query rows and on the cache's
// length; and the softmax of a row with masked keys (a batch row's gaps, another row's
// padding) sums its zeros in other places. Float32 differences of 1e-7 then flip the int8
// rounding of the next layer's activations and, after a few layers, a near-tie: on
// SmolLM2-135M Q4_1, 4 prompts decoded in one batch gave the single calls' text for 1 of 4.
// No PyTorch, oneDNN or transformers option fixes the reduction order.
//
// How: a key's score is its dot product with the query summed in one fixed order (16
// dimensions a lane, then the lanes pairwise), so it depends on the query and the key alone.
// The softmax takes the maximum over the allowed keys (exact in any order), sums exp(s - max)
// over the allowed keys in key order, and sums p * v over the allowed keys in key order;
// masked keys and gaps are skipped, not added as zeros. exp is a fixed polynomial (Cephes'
// expf). Lanes are GCC vector types (one AVX-512 register, or two AVX2 ones). Each product
// and its sum are one fused multiply-add, written out (madd in lanes, std::fma in a scalar
// remainder), so a lane and a remainder round alike; the file is built with
// -ffp-contract=off, so that the compiler fuses nothing else.
// Four query rows share each read of a key, and each read of a value among the keys all four
// see before any gap; each row's arithmetic is the same whether it runs in a block of four or
// alone. The loops are bound by loads, not arithmetic: a query's 16 dimensions are loaded
// once for 16 keys (12 heads x 240 keys: 27 -> 17 us for one row, 83 -> 59 us for four). A
// row that sees its keys without a gap lists them and sums its weights with whole loads
// (the same lanes in the same order): 17 -> 15 us and 58 -> 49 us.
// Fused multiply-adds, the sums of p * v kept in registers, a row's maximum and the run of
// keys it sees found 16 keys at a time took SmolLM2-135M's heads (9 x 64, 3 key/value heads)
// at 1000 keys from 255 to 199 us for six rows, and Qwen2.5-Coder-1.5B's (12 x 128, 2) from
// 270 to 239 us for four (benchmarks/attention_kernel.py --against 3bf6613; Intel Xeon family
// 6 model 167, 2 threads, 2026-12-07, commit f7bd055).
#include "aten_light.h"  // not <torch/extension.h>: why in aten_light.h

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>
#include <limits>
#include <vector>

#include "exp_approx.h"

namespace {

constexpr int64_t kLanes = 16;      // floats a vector: dimensions of a dot product or output
constexpr int64_t kRowsAtOnce = 4;  // query rows that share one read of a key
constexpr int kBlocksAtOnce = 4;    // 16-dimension output blocks summed per pass over
                                    // the keys: rows x 4 sums in registers

typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

inline Lanes load(const float* p) { Lanes v; std::memcpy(&v, p, sizeof(v)); return v; }
inline void store(float* p, Lanes v) { std::memcpy(p, &v, sizeof(v)); }
// x in every lane (one broadcast)
inline Lanes splat(float x) {
  const Lanes v = {x};
  return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}

// a * b + c in every lane, rounded once (a fused multiply-add), as std::fma rounds a scalar:
// an AVX-512 instruction, or one on each AVX2 half. Half the instructions of a product and a
// sum, which bound the dot products and the weighted sums.
inline Lanes madd(Lanes a, Lanes b, Lanes c) {
#if defined(__AVX512F__)
  return (Lanes)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  typedef float Half __attribute__((vector_size(kLanes / 2 * sizeof(float))));
  const Half lo = (Half)_mm256_fmadd_ps(
      (__m256)__builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7),
      (__m256)__builtin_shufflevector(b, b, 0, 1, 2, 3, 4, 5, 6, 7),
      (__m256)__builtin_shufflevector(c, c, 0, 1, 2, 3, 4, 5, 6, 7));
  const Half hi = (Half)_mm256_fmadd_ps(
      (__m256)__builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15),
      (__m256)__builtin_shufflevector(b, b, 8, 9, 10, 11, 12, 13, 14, 15),
      (__m256)__builtin_shufflevector(c, c, 8, 9, 10, 11, 12, 13, 14, 15));
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  for (int64_t l = 0; l < kLanes; ++l) c[l] = std::fma(a[l], b[l], c[l]);
  return c;
#endif
}

struct Shapes {
  int64_t batch, heads, kv_heads, rows, keys, dim, padded;
  int64_t key_row, value_row;  // floats from one key (value) to the next: a cache's buffer
};                             // may hold spare columns past S, so not always D

// The lanes' sum, in one fixed order (halves, then quarters, ...).
inline float lane_sum(Lanes v) {
  float a[kLanes];
  store(a, v);
  for (int64_t width = kLanes / 2; width > 0; width /= 2)
    for (int64_t l = 0; l < width; ++l) a[l] = a[l] + a[l + width];
  return a[0];
}

// The lane sums of 16 vectors, as one vector (lane j: the sum of v[j]'s lanes), each summed
// in lane_sum's order: halves, then quarters, ... (pairs of vectors are reduced together).
inline Lanes lane_sums(const Lanes* v) {
  Lanes half[8], quarter[4], eighth[2];
  for (int i = 0; i < 8; ++i)
    half[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17,
                                      18, 19, 20, 21, 22, 23) +
              __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24,
                                      25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    quarter[i] = __builtin_shufflevector(half[2 * i], half[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11,
                                         16, 17, 18, 19, 24, 25, 26, 27) +
                 __builtin_shufflevector(half[2 * i], half[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15,
                                         20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    eighth[i] = __builtin_shufflevector(quarter[2 * i], quarter[2 * i + 1], 0, 1, 4, 5, 8, 9, 12,
                                        13, 16, 17, 20, 21, 24, 25, 28, 29) +
                __builtin_shufflevector(quarter[2 * i], quarter[2 * i + 1], 2, 3, 6, 7, 10, 11,
                                        14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(eighth[0], eighth[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20,
                                 22, 24, 26, 28, 30) +
         __builtin_shufflevector(eighth[0], eighth[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21,
                                 23, 25, 27, 29, 31);
}

// One query row's dot product with one key, in 16 lanes (d, d + 16, ... summed in order).
inline Lanes dot_lanes(const float* q, const float* k, int64_t whole) {
  Lanes acc = {};
  for (int64_t d = 0; d < whole; d += kLanes) acc = madd(load(q + d), load(k + d), acc);
  return acc;
}

// The rest of a dot product: dimensions past the last whole 16, in order.
inline float dot_rest(const float* q, const float* k, int64_t whole, int64_t dim, float dot) {
  for (int64_t d = whole; d < dim; ++d) dot = std::fma(q[d], k[d], dot);
  return dot;
}

// Scores of R query rows against every key: score[r][j] = (q[r] . k[j]) * scale, the dot
// product summed 16 dimensions a lane, then the lanes (lane_sum; lane_sums for 16 keys at a
// time, in the same order), then a remainder of D mod 16 dimensions in order: a key's score
// depends on the query and the key alone.
template <int R>
void scores(const float* const* q, const float* key, const Shapes& s, float scale,
            float* const* score) {
  const int64_t whole = s.dim / kLanes * kLanes, blocks = s.keys / kLanes * kLanes;
  for (int64_t j0 = 0; j0 < blocks; j0 += kLanes) {
    for (int r = 0; r < R; ++r) {
      // dot_lanes for 16 keys at once, the query's 16 dimensions loaded once for all of them
      // (loads, not arithmetic, bound this loop): each lane's sum is in dot_lanes's order
      Lanes acc[kLanes] = {};
      for (int64_t d = 0; d < whole; d += kLanes) {
        const Lanes qd = load(q[r] + d);
        for (int64_t l = 0; l < kLanes; ++l)
          acc[l] = madd(qd, load(key + (j0 + l) * s.key_row + d), acc[l]);
      }
      Lanes sums = lane_sums(acc);
      if (whole < s.dim)
        for (int64_t l = 0; l < kLanes; ++l)
          sums[l] = dot_rest(q[r], key + (j0 + l) * s.key_row, whole, s.dim, sums[l]);
      store(score[r] + j0, sums * scale);
    }
  }
  for (int64_t j = blocks; j < s.keys; ++j) {
    for (int r = 0; r < R; ++r) {
      const float* k = key + j * s.key_row;
      score[r][j] = dot_rest(q[r], k, whole, s.dim, lane_sum(dot_lanes(q[r], k, whole))) * scale;
    }
  }
}

// exp(score - top) of a row's scores, in place, over the padded length (exp_approx.h).
void exponentiate(float* score, float top, int64_t padded) {
  for (int64_t j = 0; j < padded; ++j) score[j] = lookahead::exp_approx(score[j] - top);
}

// Which keys a query row sees: its row of a bool mask (``bytes``, nonzero: sees), or of an
// additive one (``additive``, 0: sees), or else the first ``limit`` keys.
struct RowMask {
  const uint8_t* bytes = nullptr;
  const float* additive = nullptr;
  int64_t limit = 0;

  bool sees(int64_t j) const {
    return bytes ? bytes[j] != 0 : additive ? additive[j] == 0.0f : j < limit;
  }

  // How many of the first ``keys`` keys the row sees before its first unseen one, read 16
  // at a time: a decoding step's rows see the whole cache and differ only in the last few
  // keys, and testing keys one at a time took a fifth of the kernel at 1000 keys.
  int64_t run(int64_t keys) const {
    int64_t j = 0;
    if (bytes) {
      for (; j + 16 <= keys; j += 16) {
        uint64_t a, b;
        std::memcpy(&a, bytes + j, 8);
        std::memcpy(&b, bytes + j + 8, 8);
        // every byte nonzero: no byte of (x - 0x01..) & ~x & 0x80.. set
        if (((a - 0x0101010101010101ull) & ~a & 0x8080808080808080ull) |
            ((b - 0x0101010101010101ull) & ~b & 0x8080808080808080ull)) break;
      }
    } else if (additive) {
      for (; j + kLanes <= keys; j += kLanes) {
        const Lanes x = load(additive + j);
        bool all = true;
        for (int64_t l = 0; l < kLanes; ++l) all = all && x[l] == 0.0f;
        if (!all) break;
      }
    } else {
      return std::max<int64_t>(0, std::min(limit, keys));  // a causal row past the keys: none
    }
    while (j < keys && sees(j)) ++j;
    return j;
  }
};

// A row's softmax weights, in place over its scores, and their total over the keys it sees,
// summed in a fixed order of those keys; ``seen`` gets their indices.
float softmax(float* score, const RowMask& mask, const Shapes& s, std::vector<int32_t>& seen) {
  // seen starts 0, 1, ..., run - 1: the keys before the row's first unseen one
  const int64_t run = mask.run(s.keys);
  seen.resize(run);
  for (int64_t j = 0; j < run; ++j) seen[j] = static_cast<int32_t>(j);
  if (mask.bytes != nullptr || mask.additive != nullptr)
    for (int64_t j = run; j < s.keys; ++j)
      if (mask.sees(j)) seen.push_back(static_cast<int32_t>(j));
  if (seen.empty()) return 0.0f;  // a row that sees nothing
  // The maximum, 16 keys of the run at a time (a maximum is exact in any order; one key at
  // a time waited on each comparison: a seventh of the kernel at 1000 keys).
  const int64_t count = static_cast<int64_t>(seen.size()), whole = count / kLanes * kLanes;
  const int64_t loaded = std::min(run / kLanes * kLanes, whole);
  float top = -std::numeric_limits<float>::infinity();
  if (loaded > 0) {
    Lanes tops = load(score);
    for (int64_t i = kLanes; i < loaded; i += kLanes) {
      const Lanes x = load(score + i);
      tops = tops > x ? tops : x;
    }
    for (int64_t l = 0; l < kLanes; ++l) top = std::max(top, tops[l]);
  }
  for (int64_t i = loaded; i < count; ++i) top = std::max(top, score[seen[i]]);
  exponentiate(score, top, s.padded);
  // The i-th key seen goes to lane i mod 16: the same lane for the same key in any pass, as
  // the keys a row sees are the same in the same order; 16 sums keep the adds from waiting.
  // Within the run the i-th key seen is key i: its lanes are loaded whole.
  Lanes lanes = {};
  for (int64_t i = 0; i < loaded; i += kLanes) lanes = lanes + load(score + i);
  for (int64_t i = loaded; i < whole; i += kLanes) {
    Lanes x;
    for (int64_t l = 0; l < kLanes; ++l) x[l] = score[seen[i + l]];
    lanes = lanes + x;
  }
  for (int64_t i = whole; i < count; ++i) lanes[i - whole] = lanes[i - whole] + score[seen[i]];
  return lane_sum(lanes);
}

// How many keys a row sees before its first gap: its ``seen`` starts 0, 1, ..., that - 1.
int64_t leading(const std::vector<int32_t>& seen) {
  // seen is increasing, so seen[i] >= i, and seen[i] == i only before the first gap
  int64_t low = 0, high = static_cast<int64_t>(seen.size());
  while (low < high) {
    const int64_t middle = (low + high) / 2;
    if (seen[middle] == middle) low = middle + 1;
    else high = middle;
  }
  return low;
}

// Blocks of 16 dimensions [first, first + N) of R rows' outputs: for each row, the sum over
// the keys it sees, in order, of p[j] * v[j]. The first ``shared`` keys are seen by every
// row: their values are loaded once for all R rows (loads bound this loop). Each row's lanes
// still add its keys in its own order, so a row's sums are the same in a block or alone.
template <int R, int N>
void weigh_blocks(const float* const* p, const std::vector<int32_t>* seen, int64_t shared,
                  const float* value, int64_t row, int64_t first,
                  Lanes (*acc)[kBlocksAtOnce]) {
  // the sums in locals, so that they stay in registers (through ``acc`` they went to memory
  // at every key)
  Lanes sum[R][N];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < N; ++n) sum[r][n] = Lanes{};
  for (int64_t j = 0; j < shared; ++j) {
    const float* v = value + j * row + first * kLanes;
    Lanes vn[N];
    for (int n = 0; n < N; ++n) vn[n] = load(v + n * kLanes);
    for (int r = 0; r < R; ++r) {
      const Lanes pj = splat(p[r][j]);
      for (int n = 0; n < N; ++n) sum[r][n] = madd(pj, vn[n], sum[r][n]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int64_t count = static_cast<int64_t>(seen[r].size());
    for (int64_t i = shared; i < count; ++i) {
      const int32_t j = seen[r][i];
      const float* v = value + j * row + first * kLanes;
      const Lanes pj = splat(p[r][j]);
      for (int n = 0; n < N; ++n) sum[r][n] = madd(pj, load(v + n * kLanes), sum[r][n]);
    }
    for (int n = 0; n < N; ++n) acc[r][n] = sum[r][n];
  }
}

// out[r] = (sum over the keys j row r sees, in order, of p[r][j] * v[j]) / total[r].
// ``seen[r]``: the indices of those keys; the others add nothing, not even a zero.
template <int R>
void weigh(const float* const* p, const std::vector<int32_t>* seen, const float* value,
           const Shapes& s, const float* total, float* const* out) {
  int64_t shared = s.keys;
  for (int r = 0; r < R; ++r) shared = std::min(shared, leading(seen[r]));
  const int64_t blocks = s.dim / kLanes;
  Lanes acc[R][kBlocksAtOnce];
  for (int64_t first = 0; first < blocks; first += kBlocksAtOnce) {
    const int64_t count = std::min<int64_t>(kBlocksAtOnce, blocks - first);
    switch (count) {
      case 4: weigh_blocks<R, 4>(p, seen, shared, value, s.value_row, first, acc); break;
      case 3: weigh_blocks<R, 3>(p, seen, shared, value, s.value_row, first, acc); break;
      case 2: weigh_blocks<R, 2>(p, seen, shared, value, s.value_row, first, acc); break;
      default: weigh_blocks<R, 1>(p, seen, shared, value, s.value_row, first, acc);
    }
    for (int r = 0; r < R; ++r)
      for (int64_t n = 0; n < count; ++n)
        for (int64_t l = 0; l < kLanes; ++l)
          out[r][(first + n) * kLanes + l] = total[r] > 0.0f ? acc[r][n][l] / total[r] : 0.0f;
  }
  for (int r = 0; r < R; ++r)
    for (int64_t d = blocks * kLanes; d < s.dim; ++d) {  // a D that is not a multiple of 16
      float sum = 0.0f;
      for (const int32_t j : seen[r]) sum = std::fma(p[r][j], value[j * s.value_row + d], sum);
      out[r][d] = total[r] > 0.0f ? sum / total[r] : 0.0f;
    }
}

// Scores, softmax and output of R query rows of one key/value head.
template <int R>
void attend_rows(const float* const* q, const float* key, const float* value,
                 const RowMask* mask, const Shapes& s, float scale, float* const* score,
                 float* const* out, std::vector<int32_t>* seen) {
  scores<R>(q, key, s, scale, score);
  float total[R];
  for (int r = 0; r < R; ++r) total[r] = softmax(score[r], mask[r], s, seen[r]);
  weigh<R>(score, seen, value, s, total, out);
}

// Whether an additive mask holds only 0 (sees) and masked values (at most -1e30): else it is
// a bias, which this kernel does not add.
bool only_masks(const at::Tensor& mask, int64_t keys) {
  const float* m = mask.data_ptr<float>();
  for (int64_t b = 0; b < mask.size(0); ++b)
    for (int64_t t = 0; t < mask.size(1); ++t) {
      const float* row = m + b * mask.stride(0) + t * mask.stride(1);
      for (int64_t j = 0; j < keys; ++j)
        if (row[j] != 0.0f && row[j] > -1e30f) return false;
    }
  return true;
}

// query [B, H, T, D], key/value [B, Hkv, S, D], mask [B or 1, T, >= S] (bool, or additive
// float32: 0 where a row sees the key; the last dimension contiguous) or empty (causal when
// ``causal``, else every key) -> output [B, T, H, D], float32; undefined (None) for an additive
// mask that is a bias.
at::Tensor attend(at::Tensor query, at::Tensor key, at::Tensor value,
                  at::Tensor mask, bool causal, double scale) {
  TORCH_CHECK(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat &&
              value.scalar_type() == at::kFloat, "invariant attention takes float32");
  // Strided views are read in place (a cache's keys are a view of a larger buffer, the
  // query a transposed projection): copying them cost 2 x 30 us a layer at 600 keys.
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && query.stride(3) == 1 &&
              key.stride(3) == 1 && value.stride(3) == 1,
              "query, key and value must be 4-D with their last dimension contiguous");
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(0) == query.size(0) &&
              key.size(3) == query.size(3), "key and value must be [B, Hkv, S, D] for a "
              "query [B, H, T, D]");
  const Shapes s{query.size(0), query.size(1), key.size(1), query.size(2), key.size(2),
                 query.size(3), (key.size(2) + kLanes - 1) / kLanes * kLanes,
                 key.stride(2), value.stride(2)};
  TORCH_CHECK(s.heads % s.kv_heads == 0, "query heads must be a multiple of key/value heads");
  const bool masked = mask.numel() > 0;
  const bool additive = masked && mask.scalar_type() == at::kFloat;
  if (masked)
    TORCH_CHECK((additive || mask.scalar_type() == at::kBool) && mask.dim() == 3 &&
                (mask.size(0) == s.batch || mask.size(0) == 1) && mask.size(1) == s.rows &&
                mask.size(2) >= s.keys && mask.stride(2) == 1,
                "mask must be bool or float32 [B or 1, T, >= S], its last dimension contiguous");
  if (additive && !only_masks(mask, s.keys)) return at::Tensor();
  const int64_t mask_batch = masked && mask.size(0) > 1 ? mask.stride(0) : 0;
  const int64_t mask_row = masked ? mask.stride(1) : 0;
  auto out = at::empty({s.batch, s.rows, s.heads, s.dim}, query.options());
  const int64_t groups = s.heads / s.kv_heads;
  const int64_t per_kv = groups * s.rows;  // query rows that read one key/value head
  const int64_t blocks = (per_kv + kRowsAtOnce - 1) / kRowsAtOnce;
  const float* q = query.data_ptr<float>();
  const float* v = value.data_ptr<float>();
  const char* mask_data = masked ? static_cast<const char*>(mask.data_ptr()) : nullptr;
  const int64_t element = masked ? mask.element_size() : 0;
  float* o = out.data_ptr<float>();
  at::parallel_for(0, s.batch * s.kv_heads * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(kRowsAtOnce * s.padded, 0.0f);
    std::vector<int32_t> seen[kRowsAtOnce];
    for (auto& row_seen : seen) row_seen.reserve(s.keys);
    const float* qr[kRowsAtOnce];
    float* sr[kRowsAtOnce];
    RowMask row_mask[kRowsAtOnce];
    float* row_out[kRowsAtOnce];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / blocks, first = (task % blocks) * kRowsAtOnce;
      const int64_t b = bh / s.kv_heads, kvh = bh % s.kv_heads;
      const int64_t count = std::min(kRowsAtOnce, per_kv - first);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t h = kvh * groups + (first + i) / s.rows, t = (first + i) % s.rows;
        qr[i] = q + b * query.stride(0) + h * query.stride(1) + t * query.stride(2);
        sr[i] = buffer.data() + i * s.padded;
        row_mask[i] = RowMask{};
        row_mask[i].limit = causal ? s.keys - s.rows + t + 1 : s.keys;
        if (masked) {
          const char* row = mask_data + (b * mask_batch + t * mask_row) * element;
          if (additive) row_mask[i].additive = reinterpret_cast<const float*>(row);
          else row_mask[i].bytes = reinterpret_cast<const uint8_t*>(row);
        }
        row_out[i] = o + ((b * s.rows + t) * s.heads + h) * s.dim;
      }
      const float* k = key.data_ptr<float>() + b * key.stride(0) + kvh * key.stride(1);
      const float* vh = v + b * value.stride(0) + kvh * value.stride(1);
      if (count == kRowsAtOnce) {
        attend_rows<kRowsAtOnce>(qr, k, vh, row_mask, s, scale, sr, row_out, seen);
      } else {
        for (int64_t i = 0; i < count; ++i)
          attend_rows<1>(qr + i, k, vh, row_mask + i, s, scale, sr + i, row_out + i, seen + i);
      }
    }
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attend", &attend, "row-invariant attention, float32",
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("mask"),
        py::arg("causal"), py::arg("scale"));
}
