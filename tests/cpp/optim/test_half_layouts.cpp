// 16-bit master params and optimizer states (Note [16-bit masters and states] in
// optim/step_types.h): the update is the fp32 update of the loaded values with each result
// rounded to nearest even once, on its store. The reference is the fp32 kernel run on the
// widened values, its results then rounded by half.h: an fp32 path the 16-bit one must match
// bit for bit, at every SIMD level, tail and thread count.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/check.h"
#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/lion.h"
#include "optim_test_util.h"

namespace zs::optim {
namespace {

using testing::level_supported;
using testing::randn;

uint16_t to16(float x, DType t) { return t == DType::kBFloat16 ? f32_to_bf16(x) : f32_to_f16(x); }
float from16(uint16_t h, DType t) { return t == DType::kBFloat16 ? bf16_to_f32(h) : f16_to_f32(h); }

std::vector<uint16_t> narrow(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to16(v[i], t);
  return out;
}
std::vector<float> widen(const std::vector<uint16_t>& v, DType t) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = from16(v[i], t);
  return out;
}

enum class Rule { kAdam, kAdagrad, kLion };

void step(Rule rule, StepBuffers b, int64_t step_count, const RunOptions& o) {
  if (rule == Rule::kAdam) {
    adam_step(AdamParams{1e-2, 0.9, 0.999, 1e-8, 0.01, true, true, step_count, 0.5}, b, o);
  } else if (rule == Rule::kAdagrad) {
    b.state1 = nullptr;
    adagrad_step(AdagradParams{1e-2, 1e-10, 0.01, 0.5}, b, o);
  } else {
    b.state1 = nullptr;
    lion_step(LionParams{1e-3, 0.9, 0.99, 0.01, 0.5}, b, o);
  }
}

// Three steps of a `pt` master with `st` states (each 16-bit or fp32), against three steps of
// the fp32 kernel on the widened values, rounded after each step as the 16-bit path stores.
void check_layout(Rule rule, DType pt, DType st, SimdLevel level, int threads, int64_t n) {
  const std::string what = std::string(dtype_name(pt)) + " params, " + dtype_name(st) +
                           " states, level " + std::to_string(static_cast<int>(level)) +
                           ", threads " + std::to_string(threads) + ", n " + std::to_string(n);
  const auto p0 = randn(n, 1);
  std::vector<uint16_t> p16 = narrow(p0, pt);
  std::vector<float> pref = widen(p16, pt);
  std::vector<float> s0(n, 0.f), s1(n, 0.f), r0(n, 0.f), r1(n, 0.f);
  std::vector<uint16_t> s0h(n, 0), s1h(n, 0);
  const bool half_states = st != DType::kFloat32;
  const RunOptions o{threads, static_cast<int>(level), NonTemporal::kAuto};
  const RunOptions ref_o{1, static_cast<int>(SimdLevel::kScalar), NonTemporal::kOff};
  for (int k = 1; k <= 3; ++k) {
    const std::vector<uint16_t> g = narrow(randn(n, 10 + k, 0.1f), DType::kBFloat16);
    StepBuffers b;
    b.param = p16.data();
    b.param_dtype = pt;
    b.grad = g.data();
    b.grad_dtype = DType::kBFloat16;
    b.state0 = half_states ? static_cast<void*>(s0h.data()) : s0.data();
    b.state1 = half_states ? static_cast<void*>(s1h.data()) : s1.data();
    b.state_dtype = st;
    b.numel = n;
    step(rule, b, k, o);

    StepBuffers r;
    r.param = pref.data();
    r.grad = g.data();
    r.grad_dtype = DType::kBFloat16;
    r.state0 = r0.data();
    r.state1 = r1.data();
    r.numel = n;
    step(rule, r, k, ref_o);
    for (auto& x : pref) x = from16(to16(x, pt), pt);
    if (half_states) {
      for (auto& x : r0) x = from16(to16(x, st), st);
      for (auto& x : r1) x = from16(to16(x, st), st);
    }
  }
  EXPECT_EQ(widen(p16, pt), pref) << what;
  EXPECT_EQ(half_states ? widen(s0h, st) : s0, r0) << what;
  if (rule == Rule::kAdam) {
    EXPECT_EQ(half_states ? widen(s1h, st) : s1, r1) << what;
  }
}

TEST(optim_half_layouts, SixteenBitMastersAndStatesRoundOnceFromTheFp32Update) {
  const DType bf = DType::kBFloat16, fh = DType::kFloat16, f32 = DType::kFloat32;
  const std::pair<DType, DType> layouts[] = {{bf, f32}, {bf, bf}, {fh, f32}, {fh, fh}};
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!level_supported(level)) continue;
    for (Rule rule : {Rule::kAdam, Rule::kAdagrad, Rule::kLion}) {
      for (const auto& [pt, st] : layouts) {
        for (int threads : {1, 2}) {
          for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{70001}}) {
            check_layout(rule, pt, st, level, threads, n);
          }
        }
      }
    }
  }
}

TEST(optim_half_layouts, TheUpdateReallyReachesTheSixteenBitBuffers) {
  // A guard against a layout that reads the 16-bit buffers but writes nowhere: after one
  // large-lr step every param has moved and both moments are non-zero.
  const int64_t n = 4099;
  std::vector<uint16_t> p = narrow(randn(n, 3), DType::kBFloat16), m(n, 0), v(n, 0);
  const std::vector<uint16_t> before = p;
  const std::vector<uint16_t> g = narrow(randn(n, 4), DType::kBFloat16);
  StepBuffers b;
  b.param = p.data();
  b.param_dtype = DType::kBFloat16;
  b.grad = g.data();
  b.grad_dtype = DType::kBFloat16;
  b.state0 = m.data();
  b.state1 = v.data();
  b.state_dtype = DType::kBFloat16;
  b.numel = n;
  adam_step(AdamParams{0.5, 0.9, 0.999, 1e-8, 0.0, true, true, 1, 1.0}, b, {});
  for (int64_t i = 0; i < n; ++i) {
    if (bf16_to_f32(g[i]) == 0.f) continue;
    EXPECT_NE(p[i], before[i]) << i;
    EXPECT_NE(m[i], 0) << i;
    EXPECT_NE(v[i], 0) << i;
  }
}

TEST(optim_half_layouts, MismatchedLayoutsAreRefusedByName) {
  std::vector<float> x(64, 0.f);
  std::vector<uint16_t> h(64, 0);
  StepBuffers b;
  b.param = x.data();
  b.grad = x.data();
  b.state0 = h.data();
  b.state1 = h.data();
  b.state_dtype = DType::kBFloat16;  // 16-bit states under fp32 params
  b.numel = 64;
  try {
    adam_step({}, b);
    FAIL() << "fp32 params with bf16 states were accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer states need"), std::string::npos) << e.what();
  }
  b.param = h.data();
  b.param_dtype = DType::kBFloat16;
  b.state0 = x.data();
  b.state1 = x.data();
  b.state_dtype = DType::kFloat32;
  b.param_copy = h.data();  // a 16-bit master is its own copy
  try {
    adam_step({}, b);
    FAIL() << "a bf16 master with a param_copy was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("its own 16-bit copy"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zs::optim
