// The vector-ops interface of kernels/update_rules.h on AVX2 + F16C + FMA.
// Include only from a translation unit compiled with those flags (kernels_avx2.cpp).
#pragma once

#include "optim/kernels/x86_intrinsics.h"

#include <cstdint>

namespace zs::optim {
// Internal linkage: see Note [ISA isolation] in optim/kernels/kernel_table.h.
namespace {

struct VecAvx2 {
  static constexpr int kWidth = 8;
  using F = __m256;

  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static F load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  template <bool kNt>
  static void store(float* p, F x) {
    if constexpr (kNt)
      _mm256_stream_ps(p, x);
    else
      _mm256_storeu_ps(p, x);
  }
  template <bool kNt>
  static void store16(uint16_t* p, __m128i h) {
    auto* q = reinterpret_cast<__m128i*>(p);
    if constexpr (kNt)
      _mm_stream_si128(q, h);
    else
      _mm_storeu_si128(q, h);
  }
  // See Note [16-bit rounding]: integer round-to-nearest-even, canonical NaN.
  template <bool kNt>
  static void store_bf16(uint16_t* p, F x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
    // Values are <= 0xffff, so the unsigned-saturating pack is exact.
    store16<kNt>(p, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
  template <bool kNt>
  static void store_f16(uint16_t* p, F x) {
    store16<kNt>(p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Whole 64-byte lines of the 16-bit copy are two AVX-512 vectors; narrower levels never
  // stream the copy (Note [No streaming for the 16-bit copy]).
  static constexpr bool kStreamsCopyLines = false;
  static void sfence() { _mm_sfence(); }

  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F mul_add(F a, F b, F c) { return _mm256_add_ps(_mm256_mul_ps(a, b), c); }
  static F sign(F a) {
    const __m256 zero = _mm256_setzero_ps();
    const __m256 pos = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_GT_OQ), _mm256_set1_ps(1.f));
    const __m256 neg = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_LT_OQ), _mm256_set1_ps(1.f));
    return _mm256_sub_ps(pos, neg);
  }

  struct Acc {
    __m256d lo, hi;
  };
  static Acc acc_zero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  static Acc acc_add_squares(Acc acc, F x) {
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    return {_mm256_fmadd_pd(lo, lo, acc.lo), _mm256_fmadd_pd(hi, hi, acc.hi)};
  }
  static double acc_sum(Acc acc) {
    const __m256d s = _mm256_add_pd(acc.lo, acc.hi);
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  }
};

}  // namespace
}  // namespace zs::optim
