// fp32 <-> bf16/fp16 conversions: exact round trips and round-to-nearest-even with
// subnormals kept (see Note [16-bit rounding]).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "optim/half.h"

namespace zs::optim {
namespace {

bool is_nan_bf16(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0; }
bool is_nan_f16(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

TEST(optim_half, EveryBf16RoundTripsExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto x = static_cast<uint16_t>(h);
    if (is_nan_bf16(x)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(x)));
      EXPECT_EQ(f32_to_bf16(bf16_to_f32(x)), 0x7fc0);
    } else {
      EXPECT_EQ(f32_to_bf16(bf16_to_f32(x)), x) << std::hex << h;
    }
  }
}

TEST(optim_half, EveryFp16RoundTripsExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto x = static_cast<uint16_t>(h);
    if (is_nan_f16(x)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(x)));
    } else {
      EXPECT_EQ(f32_to_f16(f16_to_f32(x)), x) << std::hex << h;
    }
  }
}

TEST(optim_half, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  // Subnormals are kept, not flushed (unlike VCVTNEPS2BF16).
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min() * 65536.f), 0x0001);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
}

TEST(optim_half, Fp16RoundsToNearestEvenAndSaturatesToInf) {
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);                // halfway past the largest finite: inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
}

}  // namespace
}  // namespace zs::optim
