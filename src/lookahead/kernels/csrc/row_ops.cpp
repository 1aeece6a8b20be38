// The small float32 operations between a quantized model's linear layers, one row at a time:
// RMS normalisation and the SiLU-gated product of a gated MLP.
//
// Why our own: at one token a pass, transformers' RMSNorm is eight PyTorch operations and the
// gated product two, each with a few microseconds of dispatch; over the 57 norms and 28 MLPs
// of a 1.5B model that was about 2 ms of a 40 ms step. Here each is one call. Each row is
// computed alone, its sums in one fixed order (16 lanes, then the lanes pairwise), so a row's
// bits do not depend on the rows beside it, which the quantized path's guarantee needs
// (docs/quantized-kernel.md). Build with -ffp-contract=off.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

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

void check_rows(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(), name,
              " must be contiguous float32 [N, D], got ", x.scalar_type(), " ", x.sizes());
}

// x [N, D] -> weight * (x * 1 / sqrt(mean(x^2) + eps)), row by row.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  check_rows(x, "x");
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(weight.scalar_type() == torch::kFloat32 && weight.dim() == 1 &&
              weight.size(0) == n && weight.is_contiguous(),
              "weight must be contiguous float32 [", n, "]");
  auto out = torch::empty_like(x);
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
torch::Tensor silu_mul(torch::Tensor gate, torch::Tensor up) {
  check_rows(gate, "gate");
  check_rows(up, "up");
  TORCH_CHECK(gate.sizes() == up.sizes(), "gate and up must have one shape, got ",
              gate.sizes(), " and ", up.sizes());
  const int64_t rows = gate.size(0), width = gate.size(1);
  auto out = torch::empty_like(gate);
  const float* g = gate.data_ptr<float>();
  const float* u = up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * width; i < end * width; ++i)
      o[i] = g[i] / (1.0f + lookahead::exp_approx(-g[i])) * u[i];
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMS normalisation, row by row, float32", py::arg("x"),
        py::arg("weight"), py::arg("eps"));
  m.def("silu_mul", &silu_mul, "silu(gate) * up, float32 [N, I]", py::arg("gate"),
        py::arg("up"));
}
