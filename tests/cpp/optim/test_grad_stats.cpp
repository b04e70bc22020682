// The fused squared-norm / inf-nan pass.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/check.h"
#include "optim/grad_stats.h"
#include "optim_test_util.h"

namespace zs::optim {
namespace {

using testing::as_dtype;
using testing::randn;

TEST(optim_grad_stats, SumSquaresMatchesDoubleForEveryDtype) {
  const auto values = randn(200003, 9);
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const auto bytes = as_dtype(values, d);
    double ref = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const float x = d == DType::kFloat32    ? values[i]
                      : d == DType::kBFloat16 ? bf16_to_f32(f32_to_bf16(values[i]))
                                              : f16_to_f32(f32_to_f16(values[i]));
      ref += static_cast<double>(x * 0.5f) * (x * 0.5f);
    }
    for (int threads : {1, 2}) {
      const GradStats s = grad_stats(bytes.data(), d, values.size(), 0.5, {threads, -1});
      EXPECT_TRUE(s.finite);
      EXPECT_NEAR(s.sum_squares, ref, 1e-12 * ref) << dtype_name(d);
    }
  }
}

TEST(optim_grad_stats, SameBitsForAnyThreadCount) {
  const auto values = randn(1 << 20, 10);
  const double one =
      grad_stats(values.data(), DType::kFloat32, values.size(), 1.0, {1, -1}).sum_squares;
  const double two =
      grad_stats(values.data(), DType::kFloat32, values.size(), 1.0, {2, -1}).sum_squares;
  EXPECT_EQ(one, two);
}

TEST(optim_grad_stats, FlagsInfAndNanAnywhere) {
  for (float bad :
       {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    for (size_t where : {size_t{0}, size_t{13}, size_t{99999}}) {
      std::vector<float> values(100000, 1.f);
      values[where] = bad;
      for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        const auto bytes = as_dtype(values, d);
        EXPECT_FALSE(grad_stats(bytes.data(), d, values.size()).finite) << where;
      }
    }
  }
}

TEST(optim_grad_stats, RejectsBadInput) {
  EXPECT_THROW(grad_stats(nullptr, DType::kFloat32, 4), ValueError);
  EXPECT_THROW(grad_stats(nullptr, DType::kFloat32, -1), ValueError);
  EXPECT_EQ(grad_stats(nullptr, DType::kFloat32, 0).sum_squares, 0.0);
}

}  // namespace
}  // namespace zs::optim
