// Bad hyperparameters and buffers are zs::ValueError naming what is wrong.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/check.h"
#include "optim/adam.h"
#include "optim/lion.h"
#include "optim/roofline.h"

namespace zs::optim {
namespace {

template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(optim_validation, HyperparametersAreNamed) {
  EXPECT_NE(error_of([] { adam_coeffs({-1.0}); }).find("learning rate"), std::string::npos);
  AdamParams p;
  p.beta2 = 1.0;
  EXPECT_NE(error_of([&] { adam_coeffs(p); }).find("betas[1]"), std::string::npos);
  p = {};
  p.step = 0;
  EXPECT_NE(error_of([&] { adam_coeffs(p); }).find("step"), std::string::npos);
  LionParams l;
  l.weight_decay = -1;
  EXPECT_NE(error_of([&] { lion_coeffs(l); }).find("weight_decay"), std::string::npos);
}

TEST(optim_validation, BuffersAreChecked) {
  std::vector<float> x(8);
  StepBuffers b{x.data(), x.data(), DType::kFloat32,  x.data(),
                nullptr,  nullptr,  DType::kBFloat16, 8};
  EXPECT_NE(error_of([&] { adam_step({}, b); }).find("second optimizer state"), std::string::npos);
  b.state1 = x.data();
  b.param_copy = x.data();
  b.copy_dtype = DType::kFloat32;
  EXPECT_NE(error_of([&] { adam_step({}, b); }).find("param_copy"), std::string::npos);
  b.numel = 0;
  b.param = nullptr;
  EXPECT_EQ(error_of([&] { adam_step({}, b); }), "");  // empty calls are fine
  EXPECT_NE(error_of([&] { adam_step({}, b, {-1, -1}); }).find("threads"), std::string::npos);
}

TEST(optim_validation, RooflineWantsAlignedBuffers) {
  alignas(64) static float buf[4 * 64];
  RooflineBuffers r{buf + 1, buf + 64, buf + 128, buf + 192, 4, nullptr};
  EXPECT_NE(error_of([&] { roofline_pass(r, 16); }).find("aligned"), std::string::npos);
  r.p = buf;
  r.grad_bytes = 3;
  EXPECT_NE(error_of([&] { roofline_pass(r, 16); }).find("grad_bytes"), std::string::npos);
}

}  // namespace
}  // namespace zs::optim
