// The small float32 operations between a quantized model's linear layers, one row at a time:
// RMS normalisation, the SiLU-gated product of a gated MLP and the rotary embedding; and the
// argmax of the logits that greedy verification reads and the top k that recycling keeps.
//
// Why our own: at one token a pass, transformers' RMSNorm is eight PyTorch operations and the
// gated product two, each with a few microseconds of dispatch; over the 57 norms and 28 MLPs
// of a 1.5B model that was about 2 ms of a 40 ms step. Here each is one call. Each row is
// computed alone, its sums in one fixed order (16 lanes, then the lanes pairwise), so a row's
// bits do not depend on the rows beside it, which the quantized path's guarantee needs
// (docs/quantized-kernel.md). Build with -ffp-contract=off.
#include "aten_light.h"  // not <torch/extension.h>: why in aten_light.h

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>

#include "exp_approx.h"

namespace {

constexpr int64_t kLanes = 16;

typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

inline Lanes load(const float* p) { Lanes v; std::memcpy(&v, p, sizeof(v)); return v; }

// The sum of a row's squares: 16 lanes in order of the columns, then the lanes halves first,
// then the columns past the last whole 16 in order.
float sum_of_squares(const float* x, int64_t n) {
  const int64_t whole = n / kLanes * kLanes;
  Lanes acc = {};
  for (int64_t d = 0; d < whole; d += kLanes) {
    const Lanes v = load(x + d);
    acc = acc + v * v;
  }
  float a[kLanes];
  std::memcpy(a, &acc, sizeof(a));
  for (int64_t width = kLanes / 2; width > 0; width /= 2)
    for (int64_t l = 0; l < width; ++l) a[l] = a[l] + a[l + width];
  float sum = a[0];
  for (int64_t d = whole; d < n; ++d) sum = sum + x[d] * x[d];
  return sum;
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), name,
              " must be contiguous float32 [N, D], got ", x.scalar_type(), " ", x.sizes());
}

// x [N, D] -> weight * (x * 1 / sqrt(mean(x^2) + eps)), row by row.
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  check_rows(x, "x");
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 1 &&
              weight.size(0) == n && weight.is_contiguous(),
              "weight must be contiguous float32 [", n, "]");
  auto out = at::empty_like(x);
  const float* xs = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);
  // Rows split between threads only when there are many: one row costs about a microsecond.
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xs + r * n;
      const float scale = 1.0f / std::sqrt(sum_of_squares(row, n) / static_cast<float>(n) +
                                           epsilon);
      float* dst = o + r * n;
      for (int64_t d = 0; d < n; ++d) dst[d] = w[d] * (row[d] * scale);
    }
  });
  return out;
}

// gate, up [N, I] -> [N, I]: silu(gate) * up, silu(g) = g / (1 + e^-g).
at::Tensor silu_mul(at::Tensor gate, at::Tensor up) {
  check_rows(gate, "gate");
  check_rows(up, "up");
  TORCH_CHECK(gate.sizes() == up.sizes(), "gate and up must have one shape, got ",
              gate.sizes(), " and ", up.sizes());
  const int64_t rows = gate.size(0), width = gate.size(1);
  auto out = at::empty_like(gate);
  const float* g = gate.data_ptr<float>();
  const float* u = up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  // Split by elements, not rows: one row of a 1.5B model's MLP is 8960 of them (about 6 us).
  at::parallel_for(0, rows * width, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      o[i] = g[i] / (1.0f + lookahead::exp_approx(-g[i])) * u[i];
  });
  return out;
}

// One tensor's rotary embedding, as transformers' apply_rotary_pos_emb computes it:
// x * cos + rotate_half(x) * sin, where rotate_half(x) = (-x[half:], x[:half]); each product
// rounded, then the sum (no fused multiply-add), so the bits are PyTorch's.
void rotate_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 at::Tensor& out) {
  const int64_t batch = x.size(0), tokens = x.size(1), heads = x.size(2), dim = x.size(3);
  const int64_t half = dim / 2, cos_batch = cos.size(0) > 1 ? tokens * dim : 0;
  const float* xs = x.data_ptr<float>();
  const float* c0 = cos.data_ptr<float>();
  const float* s0 = sin.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, batch * tokens * heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (tokens * heads), t = row / heads % tokens;
      const float* c = c0 + b * cos_batch + t * dim;
      const float* s = s0 + b * cos_batch + t * dim;
      const float* in = xs + row * dim;
      float* dst = o + row * dim;
      for (int64_t i = 0; i < half; ++i) dst[i] = in[i] * c[i] + (-in[i + half]) * s[i];
      for (int64_t i = half; i < dim; ++i) dst[i] = in[i] * c[i] + in[i - half] * s[i];
    }
  });
}

// query [B, T, H, D], key [B, T, Hkv, D], cos, sin [B or 1, T, D] (contiguous float32) ->
// the rotated query and key, in the same shapes.
std::tuple<at::Tensor, at::Tensor> rotary(at::Tensor query, at::Tensor key,
                                          at::Tensor cos, at::Tensor sin) {
  for (const at::Tensor* x : {&query, &key, &cos, &sin})
    TORCH_CHECK(x->scalar_type() == at::kFloat && x->is_contiguous(),
                "rotary takes contiguous float32 tensors, got ", x->scalar_type(), " ",
                x->sizes());
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && query.size(0) == key.size(0) &&
              query.size(1) == key.size(1) && query.size(3) == key.size(3) &&
              query.size(3) % 2 == 0, "query and key must be [B, T, H, D] with one B, T and "
              "an even D, got ", query.sizes(), " and ", key.sizes());
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 3 &&
              (cos.size(0) == 1 || cos.size(0) == query.size(0)) &&
              cos.size(1) == query.size(1) && cos.size(2) == query.size(3),
              "cos and sin must be [B or 1, T, D], got ", cos.sizes(), " and ", sin.sizes());
  auto rotated_query = at::empty_like(query);
  auto rotated_key = at::empty_like(key);
  rotate_rows(query, cos, sin, rotated_query);
  rotate_rows(key, cos, sin, rotated_key);
  return {rotated_query, rotated_key};
}

// The index of a row's first maximum, or of its first NaN where it holds one (as
// torch.argmax), in one pass: each of 16 lanes keeps its largest value and where it first
// came (and its first NaN, which comparisons skip); then the lanes are compared. A row of
// 151936 logits takes a few tens of us, where PyTorch's six operations took about 300 us
// right after a forward pass, whose weights had pushed their code and data out of the caches.
int64_t first_maximum(const float* x, int64_t n) {
  typedef int32_t Ints __attribute__((vector_size(kLanes * sizeof(int32_t))));
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  const int64_t whole = n / kLanes * kLanes;
  Ints index, at, nan_at;
  for (int32_t l = 0; l < kLanes; ++l) index[l] = at[l] = l;
  nan_at = kNone - Ints{};
  Lanes top = -std::numeric_limits<float>::infinity() - Lanes{};
  for (int64_t d = 0; d < whole; d += kLanes) {
    const Lanes v = load(x + d);
    const Ints greater = v > top;
    top = greater ? v : top;
    at = greater ? index : at;
    nan_at = (v != v) & (nan_at == kNone) ? index : nan_at;
    index += kLanes;
  }
  int64_t first_nan = kNone, best_at = whole > 0 ? at[0] : 0;
  float best = whole > 0 ? top[0] : x[0];
  for (int64_t l = 0; l < kLanes && whole > 0; ++l) {
    first_nan = std::min<int64_t>(first_nan, nan_at[l]);
    if (top[l] > best || (top[l] == best && at[l] < best_at)) best = top[l], best_at = at[l];
  }
  for (int64_t d = whole; d < n; ++d) {
    if (std::isnan(x[d])) first_nan = std::min<int64_t>(first_nan, d);
    if (x[d] > best) best = x[d], best_at = d;
  }
  return first_nan != kNone ? first_nan : best_at;
}

// logits [N, V] float32 (V >= 1, rows contiguous) -> int64 [N], each row's first_maximum.
at::Tensor argmax_rows(at::Tensor logits) {
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 2 &&
              logits.size(1) >= 1 && logits.stride(1) == 1,
              "logits must be float32 [N, V >= 1] with contiguous rows, got ",
              logits.scalar_type(), " ", logits.sizes());
  const int64_t rows = logits.size(0), n = logits.size(1), row = logits.stride(0);
  auto out = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* x = logits.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = first_maximum(x + r * row, n);
  });
  return out;
}

// The k largest entries of a row, largest first; equal ones in the order of their indices,
// NaN taken as -inf. Token Recycling keeps the top 8 of every row of a step's scores: there
// torch.topk took about 170 us a row of 151936 logits (two threads) against a few tens here.
// After the first k entries, a block of 16 is looked at one by one only where one of them
// beats the k-th so far, which after a few hundred entries is rare.
constexpr int64_t kMaxTop = 64;

void top_row(const float* x, int64_t n, int64_t k, int64_t* out) {
  typedef int32_t Ints __attribute__((vector_size(kLanes * sizeof(int32_t))));
  float value[kMaxTop];
  int64_t count = 0;
  auto insert = [&](float v, int64_t i) {
    if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
    if (count == k) {
      if (!(v > value[k - 1])) return;
      --count;
    }
    int64_t p = count++;
    for (; p > 0 && value[p - 1] < v; --p) value[p] = value[p - 1], out[p] = out[p - 1];
    value[p] = v, out[p] = i;
  };
  int64_t d = 0;
  for (; d < n && count < k; ++d) insert(x[d], d);
  const int64_t whole = d + (n - d) / kLanes * kLanes;
  for (; d < whole; d += kLanes) {
    const Lanes v = load(x + d);
    const Ints greater = v > (value[k - 1] - Lanes{});
    uint64_t words[sizeof(Ints) / 8];
    std::memcpy(words, &greater, sizeof(Ints));
    uint64_t any = 0;
    for (uint64_t w : words) any |= w;
    if (any == 0) continue;
    for (int64_t l = 0; l < kLanes; ++l)
      if (greater[l]) insert(v[l], d + l);
  }
  for (; d < n; ++d) insert(x[d], d);
}

// scores [N, V] float32 (rows contiguous), 1 <= k <= min(V, 64) -> int64 [N, k].
at::Tensor top_k_rows(at::Tensor scores, int64_t k) {
  TORCH_CHECK(scores.scalar_type() == at::kFloat && scores.dim() == 2 &&
              scores.stride(1) == 1, "scores must be float32 [N, V] with contiguous rows, got ",
              scores.scalar_type(), " ", scores.sizes());
  TORCH_CHECK(k >= 1 && k <= std::min<int64_t>(scores.size(1), kMaxTop),
              "k must be in 1 .. min(V, ", kMaxTop, "), got ", k, " for V = ", scores.size(1));
  const int64_t rows = scores.size(0), n = scores.size(1), row = scores.stride(0);
  auto out = at::empty({rows, k}, scores.options().dtype(at::kLong));
  const float* x = scores.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) top_row(x + r * row, n, k, o + r * k);
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMS normalisation, row by row, float32", py::arg("x"),
        py::arg("weight"), py::arg("eps"));
  m.def("silu_mul", &silu_mul, "silu(gate) * up, float32 [N, I]", py::arg("gate"),
        py::arg("up"));
  m.def("rotary", &rotary, "rotary embedding of query and key, float32 [B, T, H, D]",
        py::arg("query"), py::arg("key"), py::arg("cos"), py::arg("sin"));
  m.def("argmax", &argmax_rows, "each row's first maximum (first NaN), float32 [N, V]",
        py::arg("logits"));
  m.def("top_k", &top_k_rows, "each row's k largest, largest first, float32 [N, V]",
        py::arg("scores"), py::arg("k"));
}
