// The instruction-set traits of quant_linear.cpp: one struct V per build (AVX512-VNNI with BW,
// or AVX2 with F16C) whose static functions the kernel's templates are written in, and the
// rows a build multiplies per weight read. Included by quant_linear.cpp inside its anonymous
// namespace, after <immintrin.h> and <cstdint>.
#pragma once
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr const char* kIsa = "avx512vnni";
// Token rows per weight read: at most kRows, kTile unless asked otherwise (rows tried:
// docs/quantized-kernel.md).
constexpr int kRows = 12;
constexpr int kTile = 8;
struct V {
  using I = __m512i;
  using F = __m512;
  static constexpr int kLanes = 16;
  static constexpr bool kQ8Offset = true;   // Q8_0 bytes stay +128: subtract 128 * sum(x)
  static I zero() { return _mm512_setzero_si512(); }
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I set1(int32_t v) { return _mm512_set1_epi32(v); }
  static I set8(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  template <int S> static I srl(I a) { return _mm512_srli_epi16(a, S); }
  template <int S> static I sll(I a) { return _mm512_slli_epi16(a, S); }
  static I sll_n(I a, unsigned n) { return _mm512_slli_epi16(a, n); }
  static I srl_n(I a, unsigned n) { return _mm512_srli_epi16(a, n); }
  static I dot(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
  static I dot_q8(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
  static I dot16(I acc, I a, I b) { return _mm512_dpwssd_epi32(acc, a, b); }
  // 16 bytes in every 128-bit lane; lookup: each byte of idx (0..15) picks one of them
  static I table(const uint8_t* p) {
    return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I lookup(I t, I idx) { return _mm512_shuffle_epi8(t, idx); }
  static I mul(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I u8x32(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I i8x32(const uint8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I u8x16(const uint8_t* p) {
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F half(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  static F setf(float v) { return _mm512_set1_ps(v); }
  static F fmul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fsub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F fadd(F a, F b) { return _mm512_add_ps(a, b); }
  static F loadf(const float* p) { return _mm512_loadu_ps(p); }
  static void storef(float* p, F a) { _mm512_storeu_ps(p, a); }
};
#elif defined(__AVX2__) && defined(__F16C__)
constexpr const char* kIsa = "avx2";
constexpr int kRows = 6;   // 16 ymm registers: the rows' two sums each and the weights
constexpr int kTile = 4;
struct V {
  using I = __m256i;
  using F = __m256;
  static constexpr int kLanes = 8;
  static constexpr bool kQ8Offset = false;  // Q8_0 by the sign trick: no +128 offset
  static I zero() { return _mm256_setzero_si256(); }
  static I load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const I*>(p)); }
  static I set1(int32_t v) { return _mm256_set1_epi32(v); }
  static I set8(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  template <int S> static I srl(I a) { return _mm256_srli_epi16(a, S); }
  template <int S> static I sll(I a) { return _mm256_slli_epi16(a, S); }
  static I sll_n(I a, int n) { return _mm256_slli_epi16(a, n); }
  static I srl_n(I a, int n) { return _mm256_srli_epi16(a, n); }
  // u * s by bytes, pairs summed to int16 (no saturation: u <= 63 here), then pairs to int32
  static I dot(I acc, I u, I s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                                                   _mm256_set1_epi16(1)));
  }
  // Q8_0: u holds w + 128; |w| * (x * sign(w)) keeps each int16 pair under 2^15
  static I dot_q8(I acc, I u, I s) {
    const I w = _mm256_xor_si256(u, set8(0x80));
    return dot(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(s, w));
  }
  static I dot16(I acc, I a, I b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
  static I table(const uint8_t* p) {
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I lookup(I t, I idx) { return _mm256_shuffle_epi8(t, idx); }
  static I mul(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I u8x32(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I i8x32(const uint8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I u8x16(const uint8_t* p) {
    return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F half(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
  static F setf(float v) { return _mm256_set1_ps(v); }
  static F fmul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fsub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F fadd(F a, F b) { return _mm256_add_ps(a, b); }
  static F loadf(const float* p) { return _mm256_loadu_ps(p); }
  static void storef(float* p, F a) { _mm256_storeu_ps(p, a); }
};
#else
#error "quant_linear.cpp needs AVX2 and F16C (or AVX512-VNNI and BW)"
#endif

using I = V::I;
using F = V::F;
