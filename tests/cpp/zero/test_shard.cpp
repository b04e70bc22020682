#include <gtest/gtest.h>

#include "zero/shard.h"

namespace zs::zero {
namespace {

// Reference: DeepSpeed's zero3_partitioned_param_info: ceil(numel/world) per rank,
// padding = world * per_rank - numel, all of it on the last ranks.
TEST(Stage3Shard, CoversEveryElementOnceWithPaddingAtTheEnd) {
  for (int64_t numel : {0, 1, 7, 8, 9, 1000, 1001}) {
    for (int world : {1, 2, 3, 4, 8}) {
      const int64_t per_rank = (numel + world - 1) / world;
      int64_t valid_total = 0;
      for (int r = 0; r < world; ++r) {
        const ShardRange s = stage3_param_shard(numel, world, r);
        EXPECT_EQ(s.numel, per_rank);
        EXPECT_EQ(s.begin, per_rank * r);
        valid_total += s.valid;
        if (s.valid < s.numel) {
          // Once a rank is short, every later rank holds no data.
          for (int later = r + 1; later < world; ++later) {
            EXPECT_EQ(stage3_param_shard(numel, world, later).valid, 0);
          }
        }
      }
      EXPECT_EQ(valid_total, numel) << "numel=" << numel << " world=" << world;
    }
  }
}

TEST(Stage12Partition, PadsToTwiceWorldAndSplitsEvenly) {
  EXPECT_EQ(stage12_padded_numel(10, 4), 16);
  EXPECT_EQ(stage12_padded_numel(16, 4), 16);
  EXPECT_EQ(stage12_padded_numel(1, 1), 2);
  const ShardRange last = stage12_partition(10, 4, 3);
  EXPECT_EQ(last.begin, 12);
  EXPECT_EQ(last.numel, 4);
  EXPECT_EQ(last.valid, 0);
  const ShardRange second = stage12_partition(10, 4, 2);
  EXPECT_EQ(second.valid, 2);
}

TEST(Shard, RejectsBadRank) {
  EXPECT_THROW(stage3_param_shard(10, 2, 2), std::runtime_error);
  EXPECT_THROW(stage12_partition(10, 0, 0), std::runtime_error);
}

}  // namespace
}  // namespace zs::zero
