// e^y in float32 to a few ulp, the same bits on every CPU and in every lane: 2^n * p(r),
// r = y - n ln 2, p Cephes' expf polynomial. Kernels whose results must not depend on which
// library or vector width computes exp use it (std::exp differs between libm builds, and a
// call to it keeps a loop from vectorising). Build with -ffp-contract=off. The kernels that
// include it are built with a hash of this file among their flags (build.compile_kernel's
// headers), so that a change here rebuilds them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace lookahead {

inline float exp_approx(float y) {
  y = std::min(std::max(y, -87.0f), 88.0f);
  const float n = (y * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (y - n * 0.693359375f) + n * 2.12194440e-4f;  // n * 0.693359375 exact
  float p = 1.98756912e-4f;
  p = p * r + 1.39819994e-3f;
  p = p * r + 8.33345205e-3f;
  p = p * r + 4.16657962e-2f;
  p = p * r + 1.66666657e-1f;
  p = p * r + 5.0e-1f;
  const float x = (p * r) * r + r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits += static_cast<int32_t>(n) * (1 << 23);  // times 2^n
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

}  // namespace lookahead
