// The vector-ops interface of kernels/update_rules.h at width 1: the portable fallback and
// the reference every wider level must match bit for bit (see Note [One math, three ISAs]).
#pragma once

#include <cmath>
#include <cstdint>

#include "optim/half.h"

namespace zs::optim {
// Internal linkage: see Note [ISA isolation] in optim/kernels/kernel_table.h.
namespace {

struct VecScalar {
  static constexpr int kWidth = 1;
  using F = float;

  static F set1(float x) { return x; }
  static F load(const float* p) { return *p; }
  static F load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static F load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  template <bool kNt>
  static void store(float* p, F x) {
    *p = x;
  }
  template <bool kNt>
  static void store_bf16(uint16_t* p, F x) {
    *p = f32_to_bf16(x);
  }
  template <bool kNt>
  static void store_f16(uint16_t* p, F x) {
    *p = f32_to_f16(x);
  }
  // Whole 64-byte lines of the 16-bit copy are two AVX-512 vectors; narrower levels never
  // stream the copy (Note [No streaming for the 16-bit copy]).
  static constexpr bool kStreamsCopyLines = false;
  static void sfence() {}

  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F sqrt(F a) { return std::sqrt(a); }
  // a * b + c with two roundings (no fma: see Note [One math, three ISAs]).
  static F mul_add(F a, F b, F c) { return a * b + c; }
  static F sign(F a) { return a > 0.f ? 1.f : (a < 0.f ? -1.f : 0.f); }

  using Acc = double;
  static Acc acc_zero() { return 0.0; }
  static Acc acc_add_squares(Acc acc, F x) {
    const double d = x;
    return acc + d * d;
  }
  static double acc_sum(Acc acc) { return acc; }
};

}  // namespace
}  // namespace zs::optim
