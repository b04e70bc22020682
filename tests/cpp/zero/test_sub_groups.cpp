#include <gtest/gtest.h>

#include <limits>

#include "common/check.h"
#include "zero/sub_groups.h"

namespace zs::zero {
namespace {

// Every element of every partition is in exactly one sub-group, in order.
void expect_tiling(const std::vector<SubGroup>& plan, const std::vector<int64_t>& numels) {
  size_t i = 0;
  for (size_t g = 0; g < numels.size(); ++g) {
    int64_t at = 0;
    while (at < numels[g]) {
      ASSERT_LT(i, plan.size());
      EXPECT_EQ(plan[i].group, static_cast<int>(g));
      EXPECT_EQ(plan[i].begin, at);
      EXPECT_GT(plan[i].end, plan[i].begin);
      at = plan[i].end;
      ++i;
    }
    EXPECT_EQ(at, numels[g]);
  }
  EXPECT_EQ(i, plan.size());
}

TEST(SubGroups, FixedSizeCutsEachGroupOnItsOwn) {
  const std::vector<int64_t> numels = {10, 0, 7};
  const auto plan = plan_sub_groups(numels, {}, 4);
  expect_tiling(plan, numels);
  ASSERT_EQ(plan.size(), 5u);  // 4+4+2 | (empty) | 4+3
  EXPECT_EQ(plan[2].end - plan[2].begin, 2);
  EXPECT_EQ(plan[3].group, 2);
}

TEST(SubGroups, LargerThanThePartitionIsOneSubGroup) {
  const auto plan = plan_sub_groups({1000}, {}, 1000000000);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].end, 1000);
}

TEST(SubGroups, ZeroMeansOneSubGroupPerParameter) {
  // Group 0's partition starts inside a parameter (offset 0 is its tail) and holds two
  // more that begin at 3 and 8; padding after 12 stays with the last piece.
  const std::vector<int64_t> numels = {14, 5};
  const auto plan = plan_sub_groups(numels, {{3, 8}, {0}}, 0);
  expect_tiling(plan, numels);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].end, 3);
  EXPECT_EQ(plan[1].end, 8);
  EXPECT_EQ(plan[2].end, 14);
  EXPECT_EQ(plan[3].group, 1);
}

TEST(SubGroups, BadInputNamesTheProblem) {
  EXPECT_THROW(plan_sub_groups({4}, {}, -1), ValueError);
  EXPECT_THROW(plan_sub_groups({4}, {}, 0), ValueError);     // boundaries missing
  EXPECT_THROW(plan_sub_groups({4}, {{4}}, 0), ValueError);  // start outside
  try {
    plan_sub_groups({4}, {}, -1);
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.sub_group_size"), std::string::npos);
  }
}

// `at += sub_group_size` wrapped negative past INT64_MAX: the loop never ended (and grew
// its vector until memory ran out).
TEST(SubGroups, CutsNearInt64MaxEndAtThePartition) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> numels = {kMax};
  const auto plan = plan_sub_groups(numels, {}, int64_t{1} << 62);
  expect_tiling(plan, numels);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[1].begin, int64_t{1} << 62);
  EXPECT_EQ(plan[1].end, kMax);
  EXPECT_EQ(plan_sub_groups(numels, {}, kMax).size(), 1u);
}

}  // namespace
}  // namespace zs::zero
