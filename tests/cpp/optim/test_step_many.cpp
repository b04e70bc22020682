// The list form (*_step_many: every tensor in one parallel region) gives each tensor the
// bits its own *_step call gives, whatever the sizes, alignments, step counts, thread count
// and level; bad lists are named errors (Note [Many tensors, one region]).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/check.h"
#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/lion.h"
#include "optim/parallel.h"
#include "optim_test_util.h"

namespace zs::optim {
namespace {

using testing::as_dtype;
using testing::randn;

// Tensors of a model-like list: empty, tiny, odd, a vector's worth, ragged, one big enough
// to be split into many chunks. Each lives at its own offset of one arena, so starts are
// unaligned in every way.
const std::vector<int64_t> kSizes = {0, 1, 7, 16, 33, 768, 1000, 4099, 300001};

struct Arena {
  std::vector<float> p, s0, s1;
  std::vector<uint16_t> copy;
  std::vector<uint8_t> grad;
  std::vector<int64_t> offsets;
};

Arena make_arena(DType gd) {
  Arena a;
  int64_t total = 0;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    total += static_cast<int64_t>(i % 5);  // skew each tensor's start
    a.offsets.push_back(total);
    total += kSizes[i];
  }
  a.p = randn(total, 3);
  a.s0.assign(total, 0.f);
  a.s1.assign(total, 0.f);
  a.copy.assign(total, 0);
  a.grad = as_dtype(randn(total, 4, 0.1f), gd);
  return a;
}

std::vector<StepBuffers> buffers(Arena& a, DType gd, int states) {
  std::vector<StepBuffers> out;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const int64_t o = a.offsets[i];
    out.push_back({a.p.data() + o, a.grad.data() + o * dtype_size(gd), gd, a.s0.data() + o,
                   states > 1 ? a.s1.data() + o : nullptr, i % 2 ? a.copy.data() + o : nullptr,
                   DType::kBFloat16, kSizes[i]});
  }
  return out;
}

void expect_same(const Arena& a, const Arena& b, const std::string& what) {
  EXPECT_EQ(a.p, b.p) << what;
  EXPECT_EQ(a.s0, b.s0) << what;
  EXPECT_EQ(a.s1, b.s1) << what;
  EXPECT_EQ(a.copy, b.copy) << what;
}

TEST(optim_step_many, EachTensorGetsTheBitsOfItsOwnCall) {
  for (const DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const int threads : {1, 2, 3}) {
      for (const SimdLevel level :
           {SimdLevel::kScalar, SimdLevel::kNeon, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
        if (!testing::level_supported(level)) continue;
        const RunOptions o{threads, static_cast<int>(level), NonTemporal::kAuto};
        const std::string what = std::string("grad ") + dtype_name(gd) + ", threads " +
                                 std::to_string(threads) + ", " + simd_level_name(level);
        // Adam, with a different step count per tensor (params that missed a step).
        Arena one = make_arena(gd), many = make_arena(gd);
        std::vector<AdamParams> ap;
        for (size_t i = 0; i < kSizes.size(); ++i) {
          ap.push_back(
              {1e-2, 0.9, 0.999, 1e-8, 0.01, true, i % 3 != 0, static_cast<int64_t>(1 + i), 0.5});
        }
        auto b1 = buffers(one, gd, 2);
        for (size_t i = 0; i < b1.size(); ++i) adam_step(ap[i], b1[i], o);
        adam_step_many(ap, buffers(many, gd, 2), o);
        expect_same(one, many, "adam, " + what);
        // Adagrad and Lion.
        Arena one_a = make_arena(gd), many_a = make_arena(gd);
        const std::vector<AdagradParams> gp(kSizes.size(), {1e-2, 1e-10, 0.01, 0.5});
        auto b2 = buffers(one_a, gd, 1);
        for (size_t i = 0; i < b2.size(); ++i) adagrad_step(gp[i], b2[i], o);
        adagrad_step_many(gp, buffers(many_a, gd, 1), o);
        expect_same(one_a, many_a, "adagrad, " + what);
        Arena one_l = make_arena(gd), many_l = make_arena(gd);
        const std::vector<LionParams> lp(kSizes.size(), {1e-3, 0.9, 0.99, 0.01, 0.5});
        auto b3 = buffers(one_l, gd, 1);
        for (size_t i = 0; i < b3.size(); ++i) lion_step(lp[i], b3[i], o);
        lion_step_many(lp, buffers(many_l, gd, 1), o);
        expect_same(one_l, many_l, "lion, " + what);
      }
    }
  }
}

TEST(optim_step_many, ChunksCoverEveryElementOnceAndStartOnLines) {
  alignas(64) static float arena[4096];
  const float* anchors[] = {arena + 3, arena + 100, arena + 1000, arena + 1001};
  const void* untyped[] = {anchors[0], anchors[1], anchors[2], anchors[3]};
  const int64_t numels[] = {90, 0, 1, 3000};
  const auto chunks = plan_chunks(untyped, nullptr, numels, 4, 2);
  std::vector<std::vector<int>> seen(4);
  for (int i = 0; i < 4; ++i) seen[i].assign(static_cast<size_t>(numels[i]), 0);
  for (const ItemChunk& c : chunks) {
    ASSERT_LT(c.begin, c.end);
    for (int64_t e = c.begin; e < c.end; ++e) ++seen[c.item][e];
    if (c.begin > 0) {  // every chunk but an item's head starts on a 64-byte line
      EXPECT_EQ(reinterpret_cast<uintptr_t>(anchors[c.item] + c.begin) % 64, 0u);
    }
  }
  for (int i = 0; i < 4; ++i) {
    for (int v : seen[i]) EXPECT_EQ(v, 1) << "item " << i;
  }
}

TEST(optim_step_many, BadListsNameTheTensor) {
  std::vector<float> p(8), s(8);
  std::vector<float> g(8);
  StepBuffers ok{p.data(), g.data(), DType::kFloat32,  s.data(),
                 s.data(), nullptr,  DType::kBFloat16, 8};
  StepBuffers no_grad = ok;
  no_grad.grad = nullptr;
  try {
    adam_step_many({AdamParams{}, AdamParams{}}, {ok, no_grad});
    FAIL() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("adam tensor 1: grad is null"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(adam_step_many({AdamParams{}}, {ok, ok}), ValueError);
  AdamParams bad;
  bad.lr = -1;
  EXPECT_THROW(adam_step_many({AdamParams{}, bad}, {ok, ok}), ValueError);
  EXPECT_NO_THROW(lion_step_many({}, {}));
}

}  // namespace
}  // namespace zs::optim
