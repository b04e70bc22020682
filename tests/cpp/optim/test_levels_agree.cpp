// Every SIMD level produces the bits of the scalar kernels, for every grad dtype, copy
// dtype, tail length, unaligned start, thread count and store kind (Note [One math, three
// ISAs]). Levels this CPU lacks are skipped with the reason.
#include <gtest/gtest.h>

#include <vector>

#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/lion.h"
#include "optim_test_util.h"

namespace zs::optim {
namespace {

using testing::as_dtype;
using testing::randn;

struct Run {
  std::vector<float> p, s0, s1;
  std::vector<uint16_t> copy;
};

// Steps [offset, offset + n) of buffers of n + 2 * offset elements three times.
Run run(const char* kind, SimdLevel level, int threads, NonTemporal nt, DType gd, DType cd,
        int64_t offset, int64_t n) {
  const size_t total = static_cast<size_t>(n + 2 * offset);
  Run r{randn(total, 1), std::vector<float>(total, 0.f), std::vector<float>(total, 0.f),
        std::vector<uint16_t>(total, 0)};
  RunOptions o{threads, static_cast<int>(level), nt};
  for (int step = 1; step <= 3; ++step) {
    const auto g = as_dtype(randn(total, 10 + step, 0.1f), gd);
    StepBuffers b{r.p.data() + offset,
                  g.data() + offset * dtype_size(gd),
                  gd,
                  r.s0.data() + offset,
                  r.s1.data() + offset,
                  r.copy.data() + offset,
                  cd,
                  n};
    if (kind[0] == 'a' && kind[2] == 'a') {  // "adam"
      adam_step(AdamParams{1e-2, 0.9, 0.999, 1e-8, 0.01, true, true, step, 0.5}, b, o);
    } else if (kind[0] == 'a') {  // "adagrad"
      b.state1 = nullptr;
      adagrad_step(AdagradParams{1e-2, 1e-10, 0.01, 0.5}, b, o);
    } else {
      b.state1 = nullptr;
      lion_step(LionParams{1e-3, 0.9, 0.99, 0.01, 0.5}, b, o);
    }
  }
  return r;
}

void expect_same(const Run& a, const Run& b, const std::string& what) {
  EXPECT_EQ(a.p, b.p) << what;
  EXPECT_EQ(a.s0, b.s0) << what;
  EXPECT_EQ(a.s1, b.s1) << what;
  EXPECT_EQ(a.copy, b.copy) << what;
}

class optim_levels : public ::testing::TestWithParam<SimdLevel> {};

TEST_P(optim_levels, MatchScalarBitForBit) {
  const SimdLevel level = GetParam();
  if (!testing::level_supported(level)) {
    GTEST_SKIP() << "this CPU lacks " << simd_level_name(level);
  }
  for (const char* kind : {"adam", "adagrad", "lion"}) {
    for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const DType cd = gd == DType::kBFloat16 ? DType::kFloat16 : DType::kBFloat16;
      // Short calls: every tail and peel length of 8- and 16-wide vectors.
      for (int64_t n = 0; n <= 72; ++n) {
        const auto base = run(kind, SimdLevel::kScalar, 1, NonTemporal::kOff, gd, cd, 3, n);
        for (NonTemporal nt : {NonTemporal::kOn, NonTemporal::kCopy}) {
          const auto got = run(kind, level, 1, nt, gd, cd, 3, n);
          expect_same(got, base, std::string(kind) + " n=" + std::to_string(n));
        }
      }
      // A call large enough for two threads.
      const auto base = run(kind, SimdLevel::kScalar, 1, NonTemporal::kOff, gd, cd, 5, 70001);
      for (int threads : {1, 2}) {
        for (NonTemporal nt : {NonTemporal::kOff, NonTemporal::kOn, NonTemporal::kCopy}) {
          expect_same(run(kind, level, threads, nt, gd, cd, 5, 70001), base,
                      std::string(kind) + " threads=" + std::to_string(threads));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, optim_levels,
                         ::testing::Values(SimdLevel::kScalar, SimdLevel::kNeon, SimdLevel::kAvx2,
                                           SimdLevel::kAvx512),
                         [](const auto& info) { return std::string(simd_level_name(info.param)); });

}  // namespace
}  // namespace zs::optim
