// The fused Adam/AdamW, Adagrad and Lion steps against a plain double-precision loop of the
// textbook update. Against double, the fp32 params pick up one rounding (<= 2^-24 relative)
// per step, so after kSteps steps the bound is kSteps * 2^-23 (6e-6), with margin 2.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/lion.h"
#include "optim_test_util.h"

namespace zs::optim {
namespace {

using testing::randn;

double max_rel_err(const std::vector<float>& a, const std::vector<double>& ref) {
  double scale = 0, err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    scale = std::max(scale, std::fabs(ref[i]));
    err = std::max(err, std::fabs(a[i] - ref[i]));
  }
  return err / scale;
}

constexpr int64_t kN = 1003;
constexpr int kSteps = 50;
const double kTol = kSteps * std::ldexp(1.0, -23);

TEST(optim_reference, AdamBothModesWithAndWithoutBiasCorrection) {
  for (bool adamw : {true, false}) {
    for (bool bc : {true, false}) {
      std::vector<float> p = randn(kN, 1), m(kN, 0.f), v(kN, 0.f);
      std::vector<double> rp(p.begin(), p.end()), rm(kN, 0.0), rv(kN, 0.0);
      const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05;
      for (int step = 1; step <= kSteps; ++step) {
        const auto g = randn(kN, 100 + step);
        adam_step({lr, b1, b2, eps, wd, bc, adamw, step, 1.0},
                  {p.data(), g.data(), DType::kFloat32, m.data(), v.data(), nullptr,
                   DType::kBFloat16, kN});
        const double bc1 = bc ? 1 - std::pow(b1, step) : 1, bc2 = bc ? 1 - std::pow(b2, step) : 1;
        for (int64_t i = 0; i < kN; ++i) {
          double gi = g[i];
          if (!adamw) gi += wd * rp[i];
          if (adamw) rp[i] *= 1 - lr * wd;
          rm[i] = b1 * rm[i] + (1 - b1) * gi;
          rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
          rp[i] -= lr / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + eps);
        }
      }
      EXPECT_LT(max_rel_err(p, rp), kTol) << "adamw=" << adamw << " bc=" << bc;
      EXPECT_LT(max_rel_err(m, rm), kTol);
      EXPECT_LT(max_rel_err(v, rv), kTol);
    }
  }
}

TEST(optim_reference, Adagrad) {
  std::vector<float> p = randn(kN, 2), s(kN, 0.f);
  std::vector<double> rp(p.begin(), p.end()), rs(kN, 0.0);
  for (int step = 1; step <= kSteps; ++step) {
    const auto g = randn(kN, 200 + step);
    adagrad_step({1e-2, 1e-10, 0.05, 1.0}, {p.data(), g.data(), DType::kFloat32, s.data(), nullptr,
                                            nullptr, DType::kBFloat16, kN});
    for (int64_t i = 0; i < kN; ++i) {
      const double gi = g[i] + 0.05 * rp[i];
      rs[i] += gi * gi;
      rp[i] -= 1e-2 * gi / (std::sqrt(rs[i]) + 1e-10);
    }
  }
  EXPECT_LT(max_rel_err(p, rp), kTol);
  EXPECT_LT(max_rel_err(s, rs), kTol);
}

TEST(optim_reference, LionMovesEachParamByLrTimesSign) {
  std::vector<float> p = randn(kN, 3), m = randn(kN, 4);
  const std::vector<float> p0 = p, m0 = m;
  const auto g = randn(kN, 5);
  lion_step({1e-3, 0.9, 0.99, 0.0, 1.0}, {p.data(), g.data(), DType::kFloat32, m.data(), nullptr,
                                          nullptr, DType::kBFloat16, kN});
  for (int64_t i = 0; i < kN; ++i) {
    const double c = 0.9 * m0[i] + 0.1 * g[i];
    const double expect = p0[i] - 1e-3 * ((c > 0) - (c < 0));
    EXPECT_NEAR(p[i], expect, 1e-6 * std::fabs(expect) + 1e-12) << i;
    EXPECT_NEAR(m[i], 0.99 * m0[i] + 0.01 * g[i], 1e-6);
  }
}

}  // namespace
}  // namespace zs::optim
