// The vector-ops interface of kernels/update_rules.h on AVX-512 (F, BW, VL) + F16C + FMA.
// Include only from a translation unit compiled with those flags (kernels_avx512.cpp).
#pragma once

#include "optim/kernels/x86_intrinsics.h"

#include <cstdint>

namespace zs::optim {
// Internal linkage: see Note [ISA isolation] in optim/kernels/kernel_table.h.
namespace {

struct VecAvx512 {
  static constexpr int kWidth = 16;
  using F = __m512;

  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static F load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  template <bool kNt>
  static void store(float* p, F x) {
    if constexpr (kNt)
      _mm512_stream_ps(p, x);
    else
      _mm512_storeu_ps(p, x);
  }
  template <bool kNt>
  static void store16(uint16_t* p, __m256i h) {
    auto* q = reinterpret_cast<__m256i*>(p);
    if constexpr (kNt)
      _mm256_stream_si256(q, h);
    else
      _mm256_storeu_si256(q, h);
  }
  // See Note [16-bit rounding]: integer round-to-nearest-even, canonical NaN.
  static __m256i to_bf16(F x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(r);
  }
  static __m256i to_f16(F x) {
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  template <bool kNt>
  static void store_bf16(uint16_t* p, F x) {
    store16<kNt>(p, to_bf16(x));
  }
  template <bool kNt>
  static void store_f16(uint16_t* p, F x) {
    store16<kNt>(p, to_f16(x));
  }
  // Two vectors of params as one whole 64-byte line of 16-bit values, streamed
  // (Note [No streaming for the 16-bit copy]). p must be 64-byte aligned.
  static constexpr bool kStreamsCopyLines = true;
  template <bool kF16>
  static void stream_copy_line(uint16_t* p, F a, F b) {
    const __m256i lo = kF16 ? to_f16(a) : to_bf16(a), hi = kF16 ? to_f16(b) : to_bf16(b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p),
                        _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
  }
  static void sfence() { _mm_sfence(); }

  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F mul_add(F a, F b, F c) { return _mm512_add_ps(_mm512_mul_ps(a, b), c); }
  static F sign(F a) {
    const __m512 zero = _mm512_setzero_ps();
    const __mmask16 pos = _mm512_cmp_ps_mask(a, zero, _CMP_GT_OQ);
    const __mmask16 neg = _mm512_cmp_ps_mask(a, zero, _CMP_LT_OQ);
    const __m512 r = _mm512_mask_mov_ps(zero, pos, _mm512_set1_ps(1.f));
    return _mm512_mask_mov_ps(r, neg, _mm512_set1_ps(-1.f));
  }

  struct Acc {
    __m512d lo, hi;
  };
  static Acc acc_zero() { return {_mm512_setzero_pd(), _mm512_setzero_pd()}; }
  static Acc acc_add_squares(Acc acc, F x) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi = _mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    return {_mm512_fmadd_pd(lo, lo, acc.lo), _mm512_fmadd_pd(hi, hi, acc.hi)};
  }
  static double acc_sum(Acc acc) { return _mm512_reduce_add_pd(_mm512_add_pd(acc.lo, acc.hi)); }
};

}  // namespace
}  // namespace zs::optim
