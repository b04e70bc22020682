// Scalar fp32 <-> bf16/fp16 conversions, bit-exact with the vector paths and with torch.
//
// Note [16-bit rounding]
// Every path (scalar, AVX2, AVX-512) rounds fp32 to 16 bits to nearest-even and keeps
// subnormals, exactly like torch's `.to(torch.bfloat16)` / `.to(torch.float16)`. So a
// 16-bit param copy written by the kernel equals `p.to(dtype)` of its fp32 result, and
// every dispatch level produces the same bits. For bf16 that rules out AVX512_BF16's
// VCVTNEPS2BF16, which flushes subnormal inputs and outputs to zero; the integer
// round-to-nearest-even below costs a few integer ops per vector, hidden under memory
// time. NaN becomes the canonical quiet NaN (0x7fc0 for bf16, 0x7e00 for fp16).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace zs::optim {
// Internal linkage: see Note [ISA isolation] in optim/kernels/kernel_table.h.
namespace {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// From the FP16 library (Marat Dukhan, MIT), also used by c10: exact for every input,
// needs IEEE fp32 arithmetic in round-to-nearest without flush-to-zero.
inline float f16_to_f32(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xe0u << 23;
  const float exp_scale = f32_from_bits(0x7800000u);  // 2^-112
  const float normalized = f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float denormalized = f32_from_bits((two_w >> 17) | magic_mask) - 0.5f;
  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result = sign | (two_w < denormalized_cutoff ? f32_bits(denormalized)
                                                              : f32_bits(normalized));
  return f32_from_bits(result);
}

inline uint16_t f32_to_f16(float f) {
  const float scale_to_inf = f32_from_bits(0x77800000u);   // 2^112
  const float scale_to_zero = f32_from_bits(0x08800000u);  // 2^-110
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = f32_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007c00u;
  const uint32_t mantissa_bits = bits & 0x00000fffu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
}

}  // namespace
}  // namespace zs::optim
