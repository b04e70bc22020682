#include <gtest/gtest.h>

#include <cstdlib>

#include "common/check.h"
#include "common/cpu_features.h"

namespace zs {
namespace {

TEST(CpuFeatures, LevelIsConsistentWithTheFlags) {
  unsetenv("ZS_SIMD");
  const CpuFeatures& f = cpu_features();
  const SimdLevel level = best_simd_level();
  if (level == SimdLevel::kAvx512) {
    EXPECT_TRUE(f.avx512f && f.avx512bw && f.fma);
  }
  if (level == SimdLevel::kAvx2) {
    EXPECT_TRUE(f.avx2 && f.fma && f.f16c);
  }
#if defined(__x86_64__)
  EXPECT_NE(level, SimdLevel::kNeon);
#endif
}

TEST(CpuFeatures, EnvironmentCapsTheLevelButNeverRaisesIt) {
  unsetenv("ZS_SIMD");
  const SimdLevel natural = best_simd_level();
  setenv("ZS_SIMD", "scalar", 1);
  EXPECT_EQ(best_simd_level(), SimdLevel::kScalar);
  setenv("ZS_SIMD", "avx512", 1);
  EXPECT_EQ(best_simd_level(), natural);
  setenv("ZS_SIMD", "sse9", 1);
  EXPECT_THROW(best_simd_level(), ValueError);
  unsetenv("ZS_SIMD");
}

TEST(CpuFeatures, NamesRoundTrip) {
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kNeon, SimdLevel::kAvx2, SimdLevel::kAvx512})
    EXPECT_EQ(parse_simd_level(simd_level_name(l)), l);
}

}  // namespace
}  // namespace zs
